"""`overlay apply`: pinned upstream + series -> patched drop-in wheel.

Everything happens in a scratch folder under build/tmp (marked with our pid, so a killed run is cleaned up by the
next one); the finished wheel is moved into place with os.replace only when every step succeeded.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from overlay.core.archive_policy import (
    MemberKind,
    MemberPolicy,
    check_member_name,
    check_members,
    check_patches,
    git_kind,
    tar_kind,
)
from overlay.core.fetch import fetch_artifact
from overlay.core.inputs import check_name
from overlay.core.lint import Problem, static_problems
from overlay.core.manifest import Artifact, Manifest, check_engine_name, load_engine
from overlay.core.patching import DirTree, MemoryTree, apply_series
from overlay.core.provenance import PROVENANCE_FILE, build_provenance, dumps, local_version
from overlay.core.series import Patch, Series, load_engine_series
from overlay.core.wheels import WheelContents, read_wheel, retag, set_version, write_wheel, zip_date_time
from overlay.errors import ConfigError, ExternalCommandError, IntegrityError, PatchError, UsageError
from overlay.fsutil import atomic_write_json, owned_scratch, publish_file, safe_relpath
from overlay.git import ops as gitops
from overlay.paths import layout
from overlay.proc import run_step
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
                contents = _patched_from_wheel(manifest, path, patches, reporter)
            else:
                contents = _patched_from_sdist(manifest, path, patches, scratch, reporter)
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
            contents = _patched_from_git(root, manifest, url, rev, patches, scratch, reporter)
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
            built = _streamed_wheel(
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


def member_policy(manifest: Manifest) -> MemberPolicy:
    """What the manifest allows in the engine's wheels beyond the strict archive policy (upstream.allow-members)."""
    return MemberPolicy.of(manifest.upstream.allow_members)


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


def run_prebuilt(
    root: Path,
    manifest: Manifest,
    contents: WheelContents,
    scratch: Path,
    *,
    python: Path | None,
    reporter: Reporter,
) -> dict[str, Any]:
    """Run the manifest's [prebuilt] command on the patched tree; add what it writes to the wheel and retag it."""
    import json

    assert manifest.prebuilt is not None
    py = str(python or sys.executable)
    try:
        probe = subprocess.run(
            [py, "-c", "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')"],
            capture_output=True,
            text=True,
        )
    except OSError as exc:
        raise UsageError(f"--prebuilt-python {py} cannot be run: {exc}") from None
    if probe.returncode != 0:
        raise UsageError(f"--prebuilt-python {py} does not run: {probe.stderr.strip()[-300:]}")
    pyver = probe.stdout.strip()
    tree_dir, out, info = scratch / "prebuilt-tree", scratch / "prebuilt-out", scratch / "prebuilt-info.json"
    out.mkdir(parents=True)
    for rel, data in contents.tree.files.items():
        target = tree_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    values = {"python": py, "tree": str(tree_dir), "out": str(out), "info": str(info), "root": str(root)}
    command = [part.format(**values) for part in manifest.prebuilt.command]
    proc = run_step(
        command, reporter=reporter, stage="build", what=f"prebuilt: {' '.join(command)}", cwd=root
    )
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()[-2500:]
        cls = UsageError if proc.returncode == 2 else ExternalCommandError
        raise cls(
            f"the prebuilt step of {manifest.name} failed (exit {proc.returncode}): {err}",
            tip=manifest.prebuilt.description or "see the engine's docs page for what the build needs",
        )
    added: list[dict[str, Any]] = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = str(safe_relpath(path.relative_to(out).as_posix(), what="prebuilt output"))
        data = path.read_bytes()
        contents.tree.write(rel, data, executable=bool(path.stat().st_mode & 0o111))
        added.append({"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    if not added:
        raise ExternalCommandError(f"the prebuilt step of {manifest.name} wrote nothing into {{out}}")
    retag(contents, manifest.prebuilt.tag.format(py=pyver))
    details: Any = {}
    if info.is_file():
        try:
            details = json.loads(info.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ExternalCommandError(
                f"the prebuilt step of {manifest.name} wrote an unreadable {info.name}: {exc}",
                tip="fix the [prebuilt] command so that it writes JSON (or nothing)",
            ) from None
    reporter.step(
        "build", f"prebuilt: added {', '.join(str(a['path']) for a in added)}; tag {contents.name.tags}"
    )
    return {"tag": contents.name.tags, "files": added, "details": details}


def _apply(
    tree: Any, manifest: Manifest, patches: tuple[Patch, ...], reporter: Reporter, *, package_root: str
) -> None:
    for index, patch in enumerate(patches, start=1):
        reporter.step("apply", f"[{index}/{len(patches)}] {patch.name}")
        try:
            apply_series(tree, [patch], package_root=package_root)
        except PatchError as exc:
            raise PatchError(
                exc.message,
                tip=f"refresh the patch against {manifest.name} {manifest.upstream.version}: `overlay checkout "
                f"{manifest.name} --upto {index - 1}`, re-make the change, commit, `overlay refresh {manifest.name}`",
            ) from None


def _streamed_wheel(
    manifest: Manifest,
    path: Path,
    patches: tuple[Patch, ...],
    version: str,
    provenance: bytes,
    out: Path,
    reporter: Reporter,
) -> Path:
    """The patched wheel written member by member (unchanged members' compressed bytes copied)."""
    from overlay.core.streamwheel import stream_patched_wheel
    from overlay.core.wheels import WheelName

    def apply(tree: Any) -> None:
        _apply(tree, manifest, patches, reporter, package_root=manifest.upstream.package_root)
        reporter.step("wheel", f"writing {WheelName.parse(path.name).filename(version)}")

    reporter.step("unpack", f"reading {path.name}")
    return stream_patched_wheel(
        path,
        policy=member_policy(manifest),
        version=version,
        extra={PROVENANCE_FILE: provenance},
        out_dir=out,
        apply=apply,
    )


def _patched_from_wheel(
    manifest: Manifest, path: Path, patches: tuple[Patch, ...], reporter: Reporter
) -> WheelContents:
    reporter.step("unpack", f"reading {path.name}")
    contents = read_wheel(path, policy=member_policy(manifest))
    _apply(contents.tree, manifest, patches, reporter, package_root=manifest.upstream.package_root)
    return contents


def safe_extract_tar(archive: Path, dest: Path) -> Path:
    """Extract an sdist. Every member passes the archive policy (overlay.core.archive_policy: no escaping or ``.git`` path,
    no link or special file, no colliding names) before anything is extracted. Returns its single top folder."""
    try:
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
            check_members(((m.name, tar_kind(m)) for m in members), where=archive.name)
            tops = {safe_relpath(m.name, what=f"{archive.name}: archive member").parts[0] for m in members}
            tf.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise IntegrityError(
            f"{archive} is corrupt or truncated: {exc}", tip="delete it and fetch again"
        ) from None
    if len(tops) != 1:
        raise IntegrityError(f"{archive.name}: expected one top-level folder, found {sorted(tops)}")
    return dest / tops.pop()


def build_wheel_from_tree(src: Path, out: Path, reporter: Reporter) -> Path:
    """Build a wheel with the project's own build backend (`python -m build --wheel`)."""
    out.mkdir(parents=True, exist_ok=True)
    proc = run_step(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src)],
        reporter=reporter,
        stage="build",
        what=f"python -m build --wheel {src.name}",
        env={**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "315532800")},
    )
    if proc.returncode != 0:
        raise ExternalCommandError(
            f"building a wheel from {src} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-2000:]}",
            tip="the engine's build backend needs its build requirements from the package index",
        )
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise ExternalCommandError(
            f"`python -m build` produced {[w.name for w in wheels]} instead of one wheel"
        )
    return wheels[0]


def _check_built_version(manifest: Manifest, contents: WheelContents, what: str) -> None:
    if str(contents.name.version) != manifest.upstream.version:
        raise ConfigError(
            f"{what} builds {contents.name.distribution} {contents.name.version}, but the manifest pins "
            f"{manifest.upstream.version}",
            tip="check upstream.commit / the artifact against upstream.version",
        )


def _patched_from_sdist(
    manifest: Manifest, path: Path, patches: tuple[Patch, ...], scratch: Path, reporter: Reporter
) -> WheelContents:
    reporter.step("unpack", f"extracting {path.name}")
    top = safe_extract_tar(path, scratch / "sdist")
    # An sdist's root is the package root of the git repository.
    _apply(DirTree(top), manifest, patches, reporter, package_root=manifest.upstream.package_root)
    contents = read_wheel(
        build_wheel_from_tree(top, scratch / "dist", reporter), policy=member_policy(manifest)
    )
    _check_built_version(manifest, contents, path.name)
    return contents


def git_mirror_path(root: Path, url: str) -> Path:
    return layout(root).cache / "git" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")


def _patched_from_git(
    root: Path,
    manifest: Manifest,
    url: str,
    commit: str,
    patches: tuple[Patch, ...],
    scratch: Path,
    reporter: Reporter,
) -> WheelContents:
    if "://" not in url and not url.startswith("git@"):
        local = Path(url).expanduser()
        if not local.exists():
            raise UsageError(f"git source {url!r} is neither a URL nor an existing path")
        url = str(local.resolve())
    mirror = git_mirror_path(root, url)
    reporter.step("git", f"fetching {commit[:12]} from {url}")
    gitops.clone_or_update_mirror(url, mirror, commit)
    check_git_tree(mirror, commit, manifest.upstream.package_root, where=f"{url}@{commit[:12]}")
    checkout = scratch / "git"
    gitops.checkout_tree(mirror, commit, checkout)
    _apply(DirTree(checkout), manifest, patches, reporter, package_root="")
    pkg = (
        checkout / PurePosixPath(manifest.upstream.package_root)
        if manifest.upstream.package_root
        else checkout
    )
    contents = read_wheel(
        build_wheel_from_tree(pkg, scratch / "dist", reporter), policy=member_policy(manifest)
    )
    _check_built_version(manifest, contents, f"{url}@{commit[:12]}")
    return contents


def check_git_tree(mirror: Path, commit: str, package_root: str, *, where: str) -> None:
    """The archive policy on the git source before it is checked out: no path into ``.git`` anywhere; under the
    package root (what becomes the wheel) only regular files, and no names that collide after case folding."""
    raw = gitops.run(["ls-tree", "-r", "-z", "--full-tree", commit], cwd=mirror).stdout
    prefix = package_root.strip("/") + "/" if package_root.strip("/") else ""
    members: list[tuple[str, MemberKind]] = []
    for entry in raw.split(b"\0"):
        if not entry:
            continue
        meta, _, name_bytes = entry.partition(b"\t")
        name = name_bytes.decode("utf-8", "surrogateescape")
        check_member_name(name, where=where)
        if name.startswith(prefix):
            members.append((name, git_kind(meta.split(b" ", 1)[0].decode("ascii", "replace"))))
    check_members(members, where=where)


def patched_tree(
    root: Path, manifest: Manifest, patches: tuple[Patch, ...], *, offline: bool = False
) -> MemoryTree:
    """The pinned wheel's files with ``patches`` applied (wheel layout), in memory. Used by lint and review."""
    path = fetch_artifact(root, manifest, manifest.upstream.primary, offline=offline)
    if not manifest.upstream.primary.is_wheel:
        raise UsageError(f"{manifest.name}: in-memory trees need a wheel pin, {path.name} is an sdist")
    contents = read_wheel(path, policy=member_policy(manifest))
    apply_series(contents.tree, patches, package_root=manifest.upstream.package_root)
    return contents.tree
