"""Download pinned artifacts (through pip, so the user's index, proxy and wheelhouse settings apply, or from ``url``),
verify sha256 and cache them under build/cache. A warm cache is used without touching the network."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import parse_wheel_filename

from overlay.errors import ExternalCommandError, IntegrityError, UsageError
from overlay.fsutil import owned_scratch, sha256_file
from overlay.manifest import Artifact, Manifest
from overlay.progress import NullReporter, Reporter


def cache_dir(root: Path) -> Path:
    return root / "build" / "cache"


def cached_path(root: Path, artifact: Artifact) -> Path:
    return cache_dir(root) / "artifacts" / artifact.sha256[:16] / artifact.filename


def fetch_artifact(
    root: Path,
    manifest: Manifest,
    artifact: Artifact,
    *,
    offline: bool = False,
    reporter: Reporter | None = None,
) -> Path:
    """Return the path of a verified copy of ``artifact`` in the cache, downloading it if needed."""
    reporter = reporter or NullReporter()
    dest = cached_path(root, artifact)
    if dest.is_file():
        digest = sha256_file(dest)
        if digest == artifact.sha256:
            reporter.step("fetch", f"{artifact.filename}: cached, sha256 ok")
            return dest
        # A cached file that no longer matches is not trusted: move it out of the way and fetch again.
        bad = dest.with_name(dest.name + ".corrupt")
        os.replace(dest, bad)
        reporter.step("fetch", f"{artifact.filename}: cached copy has sha256 {digest[:16]}..., expected "
                      f"{artifact.sha256[:16]}...; moved to {bad.name}, downloading again")
    if offline:
        raise UsageError(
            f"{artifact.filename} is not in the cache ({dest}) and --offline was given",
            tip=f"run `overlay fetch {manifest.name}` once with network access to the package index",
        )
    with owned_scratch(cache_dir(root) / "tmp", "fetch") as scratch:
        if artifact.url:
            reporter.step("fetch", f"{artifact.filename}: downloading from {artifact.url}")
            got = _download_url(artifact, scratch)
        else:
            reporter.step("fetch", f"{artifact.filename}: downloading through pip")
            got = _download_pip(manifest, artifact, scratch)
        digest = sha256_file(got)
        if digest != artifact.sha256:
            raise IntegrityError(
                f"sha256 mismatch for {artifact.filename}: expected {artifact.sha256}, got {digest}",
                tip="the index served a different file than the one pinned; check the index/proxy, or update the pin "
                "in overlays/" + manifest.name + ".toml only if the new file is trusted",
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, dest)
    reporter.step("fetch", f"{artifact.filename}: sha256 ok ({dest.stat().st_size} bytes)")
    return dest


def fetch_all(root: Path, manifest: Manifest, *, offline: bool = False, reporter: Reporter | None = None) -> list[Path]:
    return [fetch_artifact(root, manifest, a, offline=offline, reporter=reporter) for a in manifest.upstream.artifacts]


def _download_url(artifact: Artifact, scratch: Path) -> Path:
    assert artifact.url is not None
    target = scratch / artifact.filename
    parsed = urllib.parse.urlparse(artifact.url)
    try:
        if parsed.scheme == "file":
            shutil.copyfile(urllib.request.url2pathname(parsed.path), target)
        elif parsed.scheme in ("http", "https"):
            with urllib.request.urlopen(artifact.url, timeout=120) as resp, target.open("wb") as fh:  # noqa: S310
                shutil.copyfileobj(resp, fh)
        else:
            raise UsageError(f"artifact url {artifact.url!r}: only file://, http:// and https:// are supported")
    except OSError as exc:
        raise ExternalCommandError(f"downloading {artifact.url} failed: {exc}") from None
    return target


def pip_download_args(manifest: Manifest, artifact: Artifact) -> list[str]:
    """pip arguments that select exactly the pinned file (by its tags for a wheel, source for an sdist)."""
    req = f"{manifest.distribution}=={manifest.upstream.version}"
    args = ["download", "--no-deps", "--disable-pip-version-check", req]
    if artifact.is_wheel:
        _name, _ver, _build, tags = parse_wheel_filename(artifact.filename)
        tag: Tag = sorted(tags, key=str)[0]
        args += ["--only-binary", ":all:"]
        if tag.platform != "any":
            args += ["--platform", tag.platform]
        if tag.interpreter.startswith(("cp", "pp")) and tag.interpreter[2:].isdigit():
            args += ["--python-version", tag.interpreter[2:], "--implementation", tag.interpreter[:2]]
        if tag.abi not in ("none",):
            args += ["--abi", tag.abi]
    else:
        args += ["--no-binary", ":all:"]
    return args


def _download_pip(manifest: Manifest, artifact: Artifact, scratch: Path) -> Path:
    args = [sys.executable, "-m", "pip", *pip_download_args(manifest, artifact), "--dest", str(scratch)]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExternalCommandError(
            f"pip could not download {manifest.distribution}=={manifest.upstream.version} ({artifact.filename}): "
            f"{proc.stderr.strip()[-1500:]}",
            tip="check network access to the package index (pip config list), or set `url` for the artifact",
        )
    files = [p for p in scratch.iterdir() if p.is_file() and p.name != ".owner"]
    wanted = scratch / artifact.filename
    if not wanted.is_file():
        raise IntegrityError(
            f"pip downloaded {[p.name for p in files]} instead of the pinned {artifact.filename}",
            tip="the index does not offer the pinned file; check the pin or set `url`",
        )
    with contextlib.suppress(OSError):
        for p in files:
            if p != wanted:
                p.unlink()
    return wanted
