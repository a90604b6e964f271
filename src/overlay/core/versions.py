"""Ordered, reproducible version labels, and the older builds an output folder still holds.

The label is ``UPSTREAM+LABEL.ORDER.N.gHASH8``. ORDER is a time in UTC as YYYYMMDDHHMMSS: the later of the latest
``Date:`` among the applied patches and, when the overlay repository is a git work tree, the commit time of the last
commit that touched those patch files (or the series file). It comes from the series' content and history, never
from the clock, so the same checkout gives the same version on every machine; and since PEP 440 compares local
segments left to right, numerically, a series changed later sorts above an older build of the same upstream release,
whatever its patch count or hash. ``pkg==UPSTREAM`` still accepts it (``==`` without a local label ignores one).

Limits: uncommitted edits that keep every ``Date:`` get the committed series' ORDER (the hash then tells the builds
apart, not their order): commit, or refresh, before publishing. A shallow clone dates the series by its one commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from overlay.core.series import Patch, series_hash
from overlay.errors import ConfigError


def order_number(patches: Sequence[Patch]) -> int:
    """The latest ``Date:`` of ``patches`` as the integer YYYYMMDDHHMMSS (UTC); 0 for no patch."""
    latest = 0
    for patch in patches:
        try:
            when = parsedate_to_datetime(patch.date)
        except (TypeError, ValueError, IndexError):
            raise ConfigError(
                f"{patch.name}: its Date: header {patch.date!r} is not an RFC 2822 date",
                tip="regenerate the patch with `git format-patch` (or `overlay refresh`), which writes one",
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        latest = max(latest, int(when.astimezone(UTC).strftime("%Y%m%d%H%M%S")))
    return latest


def history_order(root: Path, series_dir: Path, patches: Sequence[Patch]) -> int:
    """The commit time (YYYYMMDDHHMMSS, UTC) of the last commit of the git work tree at ``root`` that touched the
    series file or one of ``patches``; 0 when ``root`` is not in a git work tree (or git is absent)."""
    import subprocess

    from overlay.git import ops as gitops

    if not patches or not gitops.git_available():
        return 0
    paths = [str(series_dir / "series")] + [str(series_dir / p.name) for p in patches]
    try:
        proc = gitops.run(["log", "-1", "--format=%ct", "--", *paths], cwd=root, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    text = proc.stdout.decode("ascii", "replace").strip()
    if proc.returncode != 0 or not text.isdigit():
        return 0
    return int(datetime.fromtimestamp(int(text), tz=UTC).strftime("%Y%m%d%H%M%S"))


def series_order(
    patches: Sequence[Patch], *, root: Path | None = None, series_dir: Path | None = None
) -> int:
    """ORDER (module docstring): the patches' dates, and the git history when ``root`` and ``series_dir`` are given."""
    order = order_number(patches)
    if root is not None and series_dir is not None:
        order = max(order, history_order(root, series_dir, patches))
    return order


def ordered_local_version(
    upstream: str, label: str, patches: Sequence[Patch], *, order: int | None = None
) -> str:
    """``UPSTREAM+LABEL.ORDER.N.gHASH8`` (module docstring); ``order`` defaults to the patches' dates alone."""
    order = order_number(patches) if order is None else order
    return f"{upstream}+{label}.{order}.{len(patches)}.g{series_hash(list(patches))[:8]}"


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    version: Version
    tags: str


def built_wheels(out_dir: Path, distribution: str) -> list[BuiltWheel]:
    """The wheels of ``distribution`` in ``out_dir``, oldest version first (files that are not wheels are ignored)."""
    if not out_dir.is_dir():
        return []
    found: list[BuiltWheel] = []
    want = canonicalize_name(distribution)
    for path in out_dir.glob("*.whl"):
        try:
            name, version, _build, _tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if canonicalize_name(name) == want and path.is_file():
            found.append(
                BuiltWheel(path=path, version=version, tags="-".join(path.name[:-4].split("-")[-3:]))
            )
    return sorted(found, key=lambda w: (w.version, w.tags))


def stale_wheels(out_dir: Path, distribution: str, current: Sequence[Path]) -> list[BuiltWheel]:
    """Wheels of ``distribution`` in ``out_dir`` other than ``current``: older (or other) builds."""
    keep = {p.resolve() for p in current}
    return [w for w in built_wheels(out_dir, distribution) if w.path.resolve() not in keep]


def prune(wheels: Sequence[BuiltWheel]) -> list[Path]:
    """Delete ``wheels``; returns the paths removed."""
    removed = []
    for wheel in wheels:
        wheel.path.unlink(missing_ok=True)
        removed.append(wheel.path)
    return removed
