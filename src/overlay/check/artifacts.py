"""The two wheels a check compares: the pinned stock artifact and a freshly built patched wheel, or the ones the user
deploys (``--stock-wheel`` / ``--patched-wheel``), validated before anything is installed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlay.core.archive_policy import MemberPolicy
from overlay.core.manifest import Manifest
from overlay.core.provenance import PROVENANCE_FILE
from overlay.core.series import Patch
from overlay.core.wheels import WheelName, read_wheel
from overlay.errors import IntegrityError, UsageError


@dataclass(frozen=True)
class GivenWheel:
    path: Path
    version: str
    provenance: dict[str, Any] | None  # the overlay.json a patched wheel carries


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def given_wheel(path: Path, manifest: Manifest, *, option: str, patched: bool) -> GivenWheel:
    """Validate a user-given wheel: a readable .whl of the engine's distribution, RECORD intact; a patched one must
    carry the overlay provenance (overlay.json), a stock one must not."""
    if not path.is_file() or path.suffix != ".whl":
        raise UsageError(f"{option} {path}: not a wheel file", tip="pass the path of a .whl file")
    try:
        name = WheelName.parse(path.name)
    except Exception as exc:  # packaging raises its own InvalidWheelFilename
        raise UsageError(
            f"{option} {path.name}: not a wheel file name ({exc})", tip="keep the file's original name"
        ) from exc
    if _norm(name.distribution) != _norm(manifest.distribution):
        raise UsageError(
            f"{option} {path.name} is a wheel of {name.distribution!r}, not {manifest.distribution!r}",
            tip=f"pass a {manifest.distribution} wheel",
        )
    try:
        contents = read_wheel(path, policy=MemberPolicy.of(manifest.upstream.allow_members))
    except IntegrityError as exc:
        raise UsageError(f"{option} {path.name}: {exc}", tip="rebuild or re-download the wheel") from exc
    raw = contents.tree.read(f"{contents.dist_info}/{PROVENANCE_FILE}")
    if patched and raw is None:
        raise UsageError(
            f"{option} {path.name} carries no {PROVENANCE_FILE}: it is not an overlay-built wheel",
            tip="pass the wheel `overlay apply` wrote (build/wheels/ENGINE/)",
        )
    if not patched and raw is not None:
        raise UsageError(
            f"{option} {path.name} is an overlay-built (patched) wheel", tip="pass the upstream wheel"
        )
    prov = json.loads(raw) if raw is not None else None
    return GivenWheel(path=path, version=str(name.version), provenance=prov)


def patches_of(given: GivenWheel, series: tuple[Patch, ...]) -> tuple[tuple[Patch, ...], list[str]]:
    """The patches of the current series that a given patched wheel holds (matched by content hash), and notes on
    the ones it holds that the series no longer has (their class counts as approximate)."""
    listed = ((given.provenance or {}).get("series") or {}).get("patches") or []
    by_sha = {p.sha256: p for p in series}
    held: list[Patch] = []
    notes: list[str] = []
    for entry in listed:
        p = by_sha.get(entry.get("sha256"))
        if p is not None:
            held.append(p)
        else:
            notes.append(
                f"{entry.get('name')}: in the given patched wheel, not in the current series (its flags are "
                f"unknown here; it is counted as class {entry.get('numerics') or 'approximate'})"
            )
    return tuple(held), notes
