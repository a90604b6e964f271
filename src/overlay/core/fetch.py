"""Download pinned artifacts (through pip, so the user's index, proxy and wheelhouse settings apply, or from ``url``),
verify sha256 and cache them under build/cache. A warm cache is used without touching the network."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import parse_wheel_filename

from overlay.core.manifest import Artifact, Manifest
from overlay.errors import ConfigError, ExternalCommandError, IntegrityError, OverlayError, UsageError
from overlay.fsutil import owned_scratch, publish_file, sha256_file
from overlay.paths import layout
from overlay.proc import run_step
from overlay.progress import NullReporter, Reporter


def cache_dir(root: Path) -> Path:
    return layout(root).cache


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
    check_cache_slot(dest)
    if dest.is_file():
        digest = sha256_file(dest)
        if digest == artifact.sha256:
            reporter.step("fetch", f"{artifact.filename}: cached, sha256 ok")
            return dest
        # A cached file that no longer matches is not trusted: move it out of the way and fetch again.
        bad = dest.with_name(dest.name + ".corrupt")
        os.replace(dest, bad)
        reporter.step(
            "fetch",
            f"{artifact.filename}: cached copy has sha256 {digest[:16]}..., expected "
            f"{artifact.sha256[:16]}...; moved to {bad.name}, downloading again",
        )
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
            got = _download_pip(manifest, artifact, scratch, reporter)
        digest = sha256_file(got)
        if digest != artifact.sha256:
            raise IntegrityError(
                f"sha256 mismatch for {artifact.filename}: expected {artifact.sha256}, got {digest}",
                tip="the index served a different file than the one pinned; check the index/proxy, or update the pin "
                "in overlays/" + manifest.name + ".toml only if the new file is trusted",
            )
        publish_file(got, dest)
    reporter.step("fetch", f"{artifact.filename}: sha256 ok ({dest.stat().st_size} bytes)")
    return dest


def check_cache_slot(dest: Path) -> None:
    """Refuse a cache entry that exists but is not a plain file (a folder, a symlink): we would not overwrite it."""
    if dest.is_symlink() or (dest.exists() and not dest.is_file()):
        kind = "a symlink" if dest.is_symlink() else "a folder" if dest.is_dir() else "not a regular file"
        raise UsageError(
            f"the cache entry {dest} is {kind}, where the downloaded artifact belongs",
            tip=f"remove it (`rm -r {dest}`) and run again; build/cache holds only what overlay downloads",
        )


def fetch_all(
    root: Path, manifest: Manifest, *, offline: bool = False, reporter: Reporter | None = None
) -> list[Path]:
    return [
        fetch_artifact(root, manifest, a, offline=offline, reporter=reporter)
        for a in manifest.upstream.artifacts
    ]


def _download_url(artifact: Artifact, scratch: Path, *, origin: str = "the artifact's `url`") -> Path:
    """Copy ``artifact.url`` (file://, http://, https://) to ``scratch``; ConfigError naming the url when it yields no
    file: an unsupported scheme, a folder, a missing file, an HTTP error or an answer that is not HTTP at all."""
    assert artifact.url is not None
    url = artifact.url
    target = scratch / artifact.filename
    tip = f"check {origin} ({url}): it must name the release file itself (file://, http:// or https://)"
    try:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ConfigError(
                    f"{origin} {url!r} names the host {parsed.netloc!r}; a file:// url is local", tip=tip
                )
            source = Path(urllib.request.url2pathname(parsed.path))
            if source.is_dir():
                raise ConfigError(f"{origin} {url!r} is a folder, not a release file", tip=tip)
            shutil.copyfile(source, target)
        elif parsed.scheme in ("http", "https"):
            with urllib.request.urlopen(url, timeout=120) as resp, target.open("wb") as fh:
                shutil.copyfileobj(resp, fh)
        else:
            raise ConfigError(
                f"{origin} {url!r} has the scheme {parsed.scheme + ':' if parsed.scheme else '(none)'}; only file://, "
                "http:// and https:// are supported",
                tip=tip,
            )
    except http.client.HTTPException as exc:  # the server answered, but not in HTTP (a wrong port, a proxy)
        raise ConfigError(
            f"downloading {url} failed: the answer is not HTTP ({type(exc).__name__}: {str(exc)[:80]!r})",
            tip=tip,
        ) from None
    except (
        OSError,
        ValueError,
    ) as exc:  # URLError/HTTPError (OSError), a file that is missing, a malformed url
        raise ConfigError(f"downloading {url} failed: {exc}", tip=tip) from None
    return target


_PIP_NO_MATCH = re.compile(
    r"Could not find a version that satisfies the requirement (\S+) \(from versions: ([^)]*)\)"
)


def pip_not_found(stderr: str) -> tuple[str, str] | None:
    """(requirement, versions the index has) when pip's ``stderr`` says no such version exists, else None."""
    m = _PIP_NO_MATCH.search(stderr)
    return (m.group(1), m.group(2).strip() or "none") if m else None


def pip_download_args(manifest: Manifest, artifact: Artifact) -> list[str]:
    """pip arguments that select exactly the pinned file (by its tags for a wheel, source for an sdist)."""
    req = f"{manifest.distribution_of(artifact)}=={manifest.upstream.version}"
    args = ["download", "--no-deps", "--disable-pip-version-check", req]
    if artifact.is_wheel:
        _name, _ver, _build, tags = parse_wheel_filename(artifact.filename)
        tag: Tag = sorted(tags, key=str)[0]
        args += ["--only-binary", ":all:"]
        if tag.platform != "any":
            args += ["--platform", tag.platform]
        if tag.interpreter.startswith(("cp", "pp")) and tag.interpreter[2:].isdigit():
            pyver = tag.interpreter[2:]
            # abi3: a floor, not the version; Requires-Python may ask for more (vllm: cp38, >=3.11)
            if tag.abi == "abi3":
                pyver = max(pyver, f"{sys.version_info[0]}{sys.version_info[1]}", key=int)
            args += ["--python-version", pyver, "--implementation", tag.interpreter[:2]]
        if tag.abi not in ("none",):
            args += ["--abi", tag.abi]
    else:
        args += ["--no-binary", ":all:"]
    return args


def pip_download(
    manifest: Manifest,
    like: Artifact,
    dest: Path,
    reporter: Reporter,
    *,
    what: str,
    not_found: Callable[[str, str], OverlayError],
    tip: str,
) -> list[Path]:
    """``pip download`` of ``manifest``'s release selected like ``like`` (same kind, Python tag and platform) into
    ``dest``: the one place pip downloads (your index, proxy and credentials settings apply). ``not_found(requirement,
    offered versions)`` is the error when the index does not have it; ``tip`` goes with any other pip failure."""
    args = [sys.executable, "-m", "pip", *pip_download_args(manifest, like), "--dest", str(dest)]
    proc = run_step(args, reporter=reporter, stage="fetch", what=what)
    missing = pip_not_found(proc.stderr) if proc.returncode != 0 else None
    if missing is not None:
        raise not_found(*missing)
    if proc.returncode != 0:
        raise ExternalCommandError(
            f"pip could not download {manifest.distribution_of(like)}=={manifest.upstream.version} (selected like "
            f"{like.filename}): {proc.stderr.strip()[-1500:]}",
            tip=tip,
        )
    return sorted(p for p in dest.iterdir() if p.is_file() and p.name != ".owner")


def _download_pip(manifest: Manifest, artifact: Artifact, scratch: Path, reporter: Reporter) -> Path:
    def not_found(requirement: str, offered: str) -> OverlayError:
        return ConfigError(
            f"the package index has no {requirement} matching the pinned {artifact.filename} (versions it offers: "
            f"{offered})",
            tip=f"check the pin in overlays/{manifest.name}.toml and the index pip uses (`pip config list`), "
            "or set `url` for the artifact",
        )

    files = pip_download(
        manifest,
        artifact,
        scratch,
        reporter,
        what=f"{artifact.filename}: downloading through pip",
        not_found=not_found,
        tip="check network access to the package index (pip config list), or set `url` for the artifact",
    )
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
