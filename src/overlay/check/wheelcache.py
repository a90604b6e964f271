"""The patched wheels `overlay check` runs (the whole series, and the census's and --per-patch's series prefixes),
built once per content instead of on every run.

An entry is ``Layout.check_wheels/ENGINE/KEY/``: the wheel ``overlay apply --upto N`` makes, and ``entry.json`` beside
it (the key, the wheel's name, size and sha256). KEY is the sha256 of everything the wheel's bytes come from:

- the cache format, the tool's version and the source of its wheel-making code (``overlay.core``);
- the manifest file's bytes (the pin: version, commit, artifacts with their sha256, package root, label) and the
  primary artifact's filename and sha256;
- the exact bytes of the series file and the name and bytes of every patch up to the prefix;
- the version label the build gets (its ORDER also comes from the series' git history) and ``SOURCE_DATE_EPOCH``.

A hit is verified: ``entry.json`` must parse and name this key, and the wheel beside it must have the recorded size and
sha256. Anything else (no ``entry.json``: a build killed before it finished; a wheel whose bytes changed) is removed
and built again. The wheel is published atomically by the build and ``entry.json`` is written last (atomically), so a
reader never takes a half-written entry for a hit; a lock per entry keeps two checks from building it at once. A hit
still refuses what a build refuses (a patch outside the package root, a series that does not lint).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from overlay import __version__
from overlay import core as core_package
from overlay.core.archive_policy import check_patches
from overlay.core.build import apply_engine, check_upto, lint_gate
from overlay.core.manifest import Manifest, load_engine
from overlay.core.provenance import local_version
from overlay.core.series import Patch, load_engine_series, series_hash
from overlay.fsutil import atomic_write_json, file_lock, sha256_file
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter

CACHE_FORMAT = 1
ENTRY = "entry.json"
UNUSED_DAYS = 7
"""An entry that no check has used for this many days is removed when the next wheel of its engine is built."""


@dataclass(frozen=True)
class CheckWheel:
    """A patched wheel for an arm, and whether it came from the cache (``from_cache``) or was built now."""

    wheel: Path
    version: str
    series_sha256: str
    patches: int
    key: str
    from_cache: bool

    def record(self, arm: str) -> dict[str, Any]:
        """What the check report says about it (``report["wheel_cache"]``)."""
        return {
            "arm": arm,
            "patches": self.patches,
            "wheel": self.wheel.name,
            "key": self.key,
            "from_cache": self.from_cache,
        }


@cache
def _recipe_digest() -> str:
    """The tool's version and the bytes of every module of overlay.core (the code that turns a pin and a series into
    a wheel): a changed build recipe is a new key, even before the version moves."""
    digest = hashlib.sha256(f"overlay {__version__}\n".encode())
    core = Path(core_package.__file__).parent
    for path in sorted(core.rglob("*.py")):
        digest.update(path.relative_to(core).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def wheel_key(root: Path, manifest: Manifest, patches: tuple[Patch, ...]) -> str:
    """The cache key of the wheel of ``patches`` (the series' first ``len(patches)`` patches) over the pin."""
    digest = hashlib.sha256()

    def part(label: str, data: bytes) -> None:
        digest.update(f"{label} {len(data)}\n".encode())
        digest.update(data)

    part("format", str(CACHE_FORMAT).encode())
    part("recipe", _recipe_digest().encode())
    part("manifest", manifest.path.read_bytes())
    primary = manifest.upstream.primary
    part("artifact", f"{primary.filename} {primary.sha256}".encode())
    part("series", (manifest.series_dir(root) / "series").read_bytes())
    part("prefix", str(len(patches)).encode())
    for patch in patches:
        part("patch", patch.name.encode() + b"\0" + patch.raw)
    part("version", local_version(manifest, patches, root=root).encode())
    part("source-date-epoch", os.environ.get("SOURCE_DATE_EPOCH", "").encode())
    return digest.hexdigest()


def entry_dir(root: Path, engine: str, key: str) -> Path:
    return layout(root).check_wheels / engine / key[:32]


def _verified(folder: Path, key: str) -> CheckWheel | None:
    """The entry in ``folder`` when it is complete and its wheel has the recorded bytes; else None."""
    try:
        data = json.loads((folder / ENTRY).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("version") != CACHE_FORMAT or data.get("key") != key:
        return None
    name = data.get("wheel")
    if not isinstance(name, str) or "/" in name or not name.endswith(".whl"):
        return None
    wheel = folder / name
    try:
        if not wheel.is_file() or wheel.stat().st_size != data.get("size"):
            return None
        if sha256_file(wheel) != data.get("sha256"):
            return None
    except OSError:
        return None
    return CheckWheel(
        wheel=wheel,
        version=str(data.get("wheel_version")),
        series_sha256=str(data.get("series_sha256")),
        patches=int(data.get("patches", 0)),
        key=key,
        from_cache=True,
    )


def prune(engine_dir: Path, *, keep: str, now: float | None = None) -> list[str]:
    """Removes the entries under ``engine_dir`` (but ``keep``) whose ``entry.json`` was last used more than
    UNUSED_DAYS ago, and the leftovers of builds that never finished (no ``entry.json``) older than that; returns
    the removed entries' names. An entry being built or read right now holds its lock and is skipped."""
    cutoff = (time.time() if now is None else now) - UNUSED_DAYS * 86400
    removed: list[str] = []
    for folder in sorted(engine_dir.iterdir()) if engine_dir.is_dir() else []:
        if not folder.is_dir() or folder.name == keep:
            continue
        marker = folder / ENTRY if (folder / ENTRY).is_file() else folder
        try:
            if marker.stat().st_mtime >= cutoff:
                continue
        except OSError:
            continue
        with open(engine_dir / f".{folder.name}.lock", "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder.name)
    return removed


def patched_wheel(
    *, root: Path, engine: str, upto: int | None = None, reporter: Reporter | None = None
) -> CheckWheel:
    """The patched wheel of the series (or of its first ``upto`` patches): from the cache when its inputs are
    unchanged (verified), else built by ``overlay apply`` into a fresh cache entry."""
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    series = load_engine_series(root, manifest)
    patches = check_upto(series, upto)
    key = wheel_key(root, manifest, patches)
    folder = entry_dir(root, manifest.name, key)
    with file_lock(folder.parent / f".{folder.name}.lock"):
        hit = _verified(folder, key)
        if hit is not None:
            check_patches(patches, package_root=manifest.upstream.package_root)
            lint_gate(root, manifest, series, patches, allow_unlinted=False)
            os.utime(folder / ENTRY)  # last used: what pruning goes by
            reporter.step(
                "wheel", f"{hit.wheel} ({len(patches)} patches; from the check's wheel cache, key {key[:12]})"
            )
            return hit
        shutil.rmtree(folder, ignore_errors=True)
        prune(folder.parent, keep=folder.name)
        build = apply_engine(root=root, engine=manifest.name, upto=upto, out_dir=folder, reporter=reporter)
        sha = build.provenance["series"]["sha256"]
        built = CheckWheel(
            wheel=build.wheel,
            version=build.version,
            series_sha256=sha,
            patches=len(build.patches),
            key=key,
            from_cache=False,
        )
        if sha == series_hash(list(patches)):  # the series did not change under the build: the key names it
            atomic_write_json(
                folder / ENTRY,
                {
                    "version": CACHE_FORMAT,
                    "key": key,
                    "wheel": build.wheel.name,
                    "size": build.wheel.stat().st_size,
                    "sha256": sha256_file(build.wheel),
                    "wheel_version": build.version,
                    "series_sha256": sha,
                    "patches": len(build.patches),
                },
            )
    return built
