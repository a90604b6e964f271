"""`overlay apply ENGINE` for every pinned wheel artifact (each Python tag and platform the release ships), and the
older builds the output folder still holds (listed, or pruned when asked)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from overlay.core.build import BuildResult, apply_engine, default_out_dir
from overlay.core.manifest import Artifact, Manifest, load_engine
from overlay.core.versions import BuiltWheel, prune, stale_wheels
from overlay.progress import NullReporter, Reporter


@dataclass(frozen=True)
class AllResult:
    results: tuple[BuildResult, ...]  # the primary artifact's build last
    stale: tuple[BuiltWheel, ...]  # other builds of the distribution left in the output folder
    pruned: tuple[Path, ...]

    @property
    def primary(self) -> BuildResult:
        return self.results[-1]


def build_order(manifest: Manifest) -> list[Artifact]:
    """Every pinned wheel (an sdist only when no wheel is pinned), the primary one last (its path is printed last and
    its build is the one build/state records, as with a single build)."""
    primary = manifest.upstream.primary
    wheels = [a for a in manifest.upstream.artifacts if a.is_wheel]
    if not wheels:
        return [primary]
    return [a for a in wheels if a != primary] + [primary]


def apply_all(
    *,
    root: Path,
    engine: str,
    out_dir: Path | None = None,
    upto: int | None = None,
    offline: bool = False,
    allow_unlinted: bool = False,
    prune_stale: bool = False,
    reporter: Reporter | None = None,
) -> AllResult:
    """Build the patched wheel of every pinned wheel artifact into ``out_dir`` (each one atomically, as
    ``apply_engine`` does), then list, or with ``prune_stale`` delete, the other wheels of the distribution there."""
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    order = build_order(manifest)
    results: list[BuildResult] = []
    for index, artifact in enumerate(order, start=1):
        if len(order) > 1:
            reporter.step("wheel", f"[{index}/{len(order)}] {artifact.filename}")
        results.append(
            apply_engine(
                root=root,
                engine=engine,
                out_dir=out_dir,
                upto=upto,
                offline=offline,
                artifact_name=artifact.filename,
                allow_unlinted=allow_unlinted,
                reporter=reporter,
            )
        )
    folder = out_dir or default_out_dir(root, engine)
    built = [r.wheel for r in results]
    distributions = dict.fromkeys(manifest.distribution_of(a) for a in order)  # a release under several names
    stale = [w for dist in distributions for w in stale_wheels(folder, dist, built)]
    removed: list[Path] = []
    if prune_stale:
        removed = prune(stale)
        for path in removed:
            reporter.step("wheel", f"pruned older build {path.name}")
        stale = []
    else:
        current = Version(results[-1].version)
        for wheel in stale:
            age = "older" if wheel.version < current else "newer" if wheel.version > current else "other"
            reporter.step("wheel", f"{age} build kept: {wheel.path.name} (--prune removes it)")
    return AllResult(results=tuple(results), stale=tuple(stale), pruned=tuple(removed))
