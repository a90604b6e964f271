"""The pinned upstream with the series applied, from each kind of source: the wheel (in memory, or streamed member by
member), an sdist (extracted under the archive policy, built with its own backend) or a git commit (a cached
mirror, checked out and built). Every tree passes the archive policy before anything of it is used."""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from overlay.core.archive_policy import (
    MemberKind,
    MemberPolicy,
    check_member_name,
    check_members,
    git_kind,
    tar_kind,
)
from overlay.core.manifest import Manifest
from overlay.core.patching import DirTree, apply_series
from overlay.core.provenance import PROVENANCE_FILE
from overlay.core.series import Patch
from overlay.core.wheels import WheelContents, read_wheel
from overlay.errors import ConfigError, ExternalCommandError, IntegrityError, PatchError, UsageError
from overlay.fsutil import safe_relpath
from overlay.git import ops as gitops
from overlay.paths import layout
from overlay.proc import run_step
from overlay.progress import Reporter


def member_policy(manifest: Manifest) -> MemberPolicy:
    """What the manifest allows in the engine's wheels beyond the strict archive policy (upstream.allow-members)."""
    return MemberPolicy.of(manifest.upstream.allow_members)


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


def streamed_wheel(
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


def patched_from_wheel(
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


def patched_from_sdist(
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


def patched_from_git(
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
