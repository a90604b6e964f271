"""`overlay lint ENGINE --against VERSION`: would the series still land where it was written on another release?

For each patch, in order: it must apply to VERSION's tree with every context line matching (offsets allowed, never
fuzz, no 3-way merge), and each hunk must sit in the same Python function or class as at the pinned base (the
hunk-location check, :func:`overlay.upstream.astmap.check_hunk_locations`). Nothing is written; ``overlay rebase`` is the tool
that actually moves the series.
"""

from __future__ import annotations

from pathlib import Path

from overlay.core.archive_policy import MemberPolicy
from overlay.core.lint import Problem
from overlay.core.manifest import Manifest
from overlay.core.series import Series
from overlay.core.wheels import read_wheel
from overlay.errors import PatchError
from overlay.progress import NullReporter, Reporter
from overlay.upstream.astmap import check_hunk_locations
from overlay.upstream.releases import resolve_release


def location_problems(
    root: Path,
    manifest: Manifest,
    series: Series,
    version: str,
    *,
    offline: bool = False,
    reporter: Reporter | None = None,
) -> list[Problem]:
    reporter = reporter or NullReporter()
    pin = resolve_release(
        root, manifest, manifest.upstream.version, primary_only=True, offline=offline, reporter=reporter
    )
    other = resolve_release(root, manifest, version, primary_only=True, offline=offline, reporter=reporter)
    reporter.step("lint", f"{manifest.name}: hunk locations at {other.version} vs the pin {pin.version}")
    policy = MemberPolicy.of(manifest.upstream.allow_members)
    base = read_wheel(pin.primary_path, policy=policy).tree.files
    target = read_wheel(other.primary_path, policy=policy).tree.files
    tip = f"see what a rebase would do: `overlay rebase {manifest.name} --to {other.version} --dry-run`"
    try:
        moves = check_hunk_locations(
            base, target, series.patches, package_root=manifest.upstream.package_root
        )
    except PatchError as exc:
        return [
            Problem(
                manifest.name,
                None,
                f"against {other.version}: {exc.message} (offsets allowed, no fuzz, no 3-way merge)",
                "apply",
                tip,
            )
        ]
    return [
        Problem(manifest.name, name, f"against {other.version}: hunk moved: {m.describe()}", "location", tip)
        for name, m in moves
    ]
