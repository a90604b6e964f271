"""`overlay apply`: pinned upstream + series -> patched drop-in wheel.

Everything happens in a scratch folder under build/tmp (marked with our pid, so a killed run is cleaned up by the
next one); the finished wheel is moved into place with os.replace only when every step succeeded. Each source is read
and patched in :mod:`overlay.core.sources`; ``--prebuilt`` runs in :mod:`overlay.core.prebuilt`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from overlay.core.archive_policy import check_patches
from overlay.core.fetch import fetch_artifact
from overlay.core.inputs import check_name
from overlay.core.lint import Problem, static_problems
from overlay.core.manifest import Artifact, Manifest, check_engine_name, load_engine
from overlay.core.prebuilt import run_prebuilt
from overlay.core.provenance import PROVENANCE_FILE, build_provenance, dumps, local_version
from overlay.core.series import Patch, Series, load_engine_series
from overlay.core.sources import patched_from_git, patched_from_sdist, patched_from_wheel, streamed_wheel
from overlay.core.wheels import set_version, write_wheel, zip_date_time
from overlay.errors import ConfigError, UsageError
from overlay.fsutil import atomic_write_json, owned_scratch, publish_file
from overlay.git import ops as gitops
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter
from overlay.schemas.documents import ArtifactSource, GitSource
from overlay.schemas.documents import Provenance as ProvenanceDoc

Source = Literal["pypi", "git"]


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    version: str
    patches: tuple[Patch, ...]
    provenance: ProvenanceDoc


_OUT_TIP = "pass --out DIR naming a folder you can write to (it is created when missing)"


def check_out_dir(out_dir: Path, *, what: str = "--out") -> None:
    """Refuse an output folder the wheel cannot be written into: a file, below a file, or not writable."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{what} {out_dir} is a file, not a folder", tip=_OUT_TIP)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{what} {out_dir} cannot be created: {exc.strerror or exc}", tip=_OUT_TIP) from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {out_dir} is not writable", tip=_OUT_TIP)


def default_out_dir(root: Path, engine: str) -> Path:
    return layout(root).wheels / check_engine_name(engine)


def check_upto(series: Series, upto: int | None) -> tuple[Patch, ...]:
    if upto is not None and not 0 <= upto <= len(series.patches):
        raise UsageError(f"--upto {upto} is out of range: the series has {len(series.patches)} patches")
    return series.prefix(upto)


def apply_engine(
    *,
    root: Path,
    engine: str,
    out_dir: Path | None = None,
    upto: int | None = None,
    source: Source = "pypi",
    git_url: str | None = None,
    commit: str | None = None,
    offline: bool = False,
    artifact_name: str | None = None,
    prebuilt: bool = False,
    prebuilt_python: Path | None = None,
    allow_unlinted: bool = False,
    reporter: Reporter | None = None,
) -> BuildResult:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    series = load_engine_series(root, manifest)
    patches = check_upto(series, upto)
    check_patches(patches, package_root=manifest.upstream.package_root)
    unlinted = lint_gate(root, manifest, series, patches, allow_unlinted=allow_unlinted)
    out_what = "--out" if out_dir else "the output folder"
    out_dir = out_dir or default_out_dir(root, engine)
    check_out_dir(
        out_dir, what=out_what
    )  # before the work: a read-only --out, or one that is a file, fails now
    zip_date_time()  # and so does a SOURCE_DATE_EPOCH that is not a number (before python -m build sees it)
    if prebuilt and manifest.prebuilt is None:
        raise UsageError(f"{manifest.path.name} has no [prebuilt] table: {engine} has nothing to precompile")
    with owned_scratch(layout(root).tmp, f"apply-{engine}") as scratch:
        streamed: Path | None = None
        if source == "pypi":
            artifact = select_artifact(manifest, artifact_name)
            path = fetch_artifact(root, manifest, artifact, offline=offline, reporter=reporter)
            if artifact.is_wheel and not prebuilt:
                streamed = path  # patched as it is written: overlay.core.streamwheel
            elif artifact.is_wheel:
                contents = patched_from_wheel(manifest, path, patches, reporter)
            else:
                contents = patched_from_sdist(manifest, path, patches, scratch, reporter)
            source_info: ArtifactSource | GitSource = {"kind": "artifact", "filename": artifact.filename}
            prov_artifact = artifact
        elif source == "git":
            url = gitops.check_url(
                git_url or manifest.upstream.git,
                what="--git-url" if git_url else f"{manifest.path.name}: upstream.git",
            )
            rev = commit or manifest.upstream.commit
            if not rev:
                raise UsageError(
                    f"{manifest.path.name} pins no upstream.commit, and the git source needs one",
                    tip="pass --commit SHA (and --git-url URL for a fork or local clone), or add `commit` to the manifest",
                )
            contents = patched_from_git(root, manifest, url, rev, patches, scratch, reporter)
            source_info = {"kind": "git", "url": url if "://" in url else "<local path>", "commit": rev}
            prov_artifact = None
        else:
            raise UsageError(f"unknown --source {source!r}; use pypi or git")
        prebuilt_info = None
        if prebuilt:
            assert manifest.prebuilt is not None
            prebuilt_info = run_prebuilt(
                root, manifest, contents, scratch, python=prebuilt_python, reporter=reporter
            )
        version = local_version(manifest, patches, root=root)
        provenance = build_provenance(
            manifest, patches, artifact=prov_artifact, source=source_info, root=root
        )
        if prebuilt_info is not None:
            provenance["prebuilt"] = prebuilt_info
        if unlinted:
            provenance["lint"] = {
                "allowed_unlinted": True,
                "problems": [{"patch": p.patch, "kind": p.kind, "message": p.message} for p in unlinted],
            }
        if streamed is not None:
            built = streamed_wheel(
                manifest, streamed, patches, version, dumps(provenance), scratch / "out", reporter
            )
        else:
            contents = set_version(contents, version)
            contents.tree.write(f"{contents.dist_info}/{PROVENANCE_FILE}", dumps(provenance))
            reporter.step("wheel", f"writing {contents.name.filename()}")
            built = write_wheel(contents, scratch / "out")
        final = out_dir / built.name
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            publish_file(built, final)  # --out may be on another file system
        except OSError as exc:
            raise UsageError(f"cannot write {final}: {exc.strerror or exc}", tip=_OUT_TIP) from None
    atomic_write_json(
        layout(root).state / f"{engine}.json",
        {
            "version": 1,
            "wheel": str(final),
            "wheel_version": version,
            "patches": len(patches),
            "time": int(time.time()),
        },
    )
    reporter.step("wheel", f"{final} ({len(patches)} patches)")
    return BuildResult(wheel=final, version=version, patches=patches, provenance=provenance)


def lint_gate(
    root: Path, manifest: Manifest, series: Series, patches: tuple[Patch, ...], *, allow_unlinted: bool
) -> list[Problem]:
    """Lint's static checks (trailers, numbering) on the series: refuse to build a series that fails them, unless
    ``allow_unlinted``; then return the problems, for the provenance to record."""
    applied = {p.name for p in patches}
    problems = [p for p in static_problems(root, manifest, series) if p.patch is None or p.patch in applied]
    if problems and not allow_unlinted:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(
            f"{manifest.name}: the series does not lint: {first.patch + ': ' if first.patch else ''}{first.message}{more}",
            tip=f"fix it (`overlay lint {manifest.name}` lists every problem), or build anyway with "
            f"`overlay apply {manifest.name} --allow-unlinted` (overlay.json then records the problems)",
        )
    return problems


def select_artifact(manifest: Manifest, filename: str | None) -> Artifact:
    """The pinned artifact named ``filename`` (default: the primary one, the first wheel)."""
    if filename is None:
        return manifest.upstream.primary
    check_name(filename, what="--artifact", error=UsageError)
    for artifact in manifest.upstream.artifacts:
        if artifact.filename == filename:
            return artifact
    raise UsageError(
        f"{filename!r} is not pinned in {manifest.path.name}",
        tip="pinned: " + ", ".join(a.filename for a in manifest.upstream.artifacts),
    )
