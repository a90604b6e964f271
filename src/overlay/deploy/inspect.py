"""What an engine's installation in some Python environment is: stock, patched or other; which series; whether its
files still match RECORD (the installed one) and, for stock, the pinned artifact's RECORD.

The target interpreter is asked only for its ``sys.path`` (run from an empty folder, so the caller's working
directory does not count) and, after an install, where ``import NAME`` resolves (``importlib.util.find_spec``: the
package is located, not executed, so an engine whose dependencies are absent can still be checked). Everything else is
read from the files here, through ``importlib.metadata`` on that path.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Literal

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from overlay.core.manifest import Artifact, Manifest
from overlay.core.provenance import PROVENANCE_FILE, check_label, validate
from overlay.errors import IntegrityError, UsageError

Kind = Literal["stock", "patched", "other"]
_INSTALLER_FILES = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "uv_cache.json", "uv_build.json"}
_MAX_LISTED = 5


@dataclass(frozen=True)
class Target:
    python: Path
    path: tuple[str, ...]  # sys.path of the target, '' left out


@dataclass(frozen=True)
class Installed:
    engine: str
    distribution: str
    version: str
    location: Path  # the folder holding the .dist-info
    dist_info: str
    kind: Kind
    tags: frozenset[str]  # WHEEL's Tag lines
    provenance: dict[str, Any] | None
    record_problems: tuple[str, ...]  # installed files vs the installed RECORD
    pin_problems: tuple[str, ...]  # installed files vs the pinned artifact's RECORD (checked for stock only)
    pin_checked: bool
    editable: bool
    shadowed: tuple[str, ...]  # other installations of the distribution later on sys.path

    @property
    def files_ok(self) -> bool:
        return not self.record_problems and not self.pin_problems


def probe(python: Path) -> Target:
    """``sys.path`` of the interpreter ``python``; UsageError when it cannot be run."""
    code = "import json, sys; print(json.dumps(sys.path))"
    with tempfile.TemporaryDirectory(prefix="overlay-probe-") as empty:
        try:
            proc = subprocess.run(
                [str(python), "-c", code], capture_output=True, text=True, cwd=empty, timeout=120
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UsageError(
                f"--python {python} cannot be run: {exc}",
                tip="pass --python the interpreter of the environment (e.g. /opt/venv/bin/python)",
            ) from None
    if proc.returncode != 0:
        raise UsageError(
            f"--python {python} exited {proc.returncode}: {proc.stderr.strip()[-300:]}",
            tip="pass --python the interpreter of the environment (e.g. /opt/venv/bin/python)",
        )
    try:
        paths = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise UsageError(f"--python {python} did not report its sys.path: {proc.stdout[-200:]!r}") from None
    return Target(python=python, path=tuple(p for p in paths if p and Path(p).is_dir()))


def import_origin(target: Target, import_name: str) -> Path | None:
    """Where ``import import_name`` resolves in ``target`` (the package folder), without executing the package."""
    code = (
        "import importlib.util, json, sys; s = importlib.util.find_spec(sys.argv[1]); "
        "print(json.dumps(None if s is None else (s.origin or (list(s.submodule_search_locations or []) or [None])[0])))"
    )
    with tempfile.TemporaryDirectory(prefix="overlay-probe-") as empty:
        proc = subprocess.run(
            [str(target.python), "-c", code, import_name],
            capture_output=True,
            text=True,
            cwd=empty,
            timeout=120,
        )
    if proc.returncode != 0:
        raise IntegrityError(
            f"{target.python}: locating `import {import_name}` failed: {proc.stderr.strip()[-300:]}"
        )
    origin = json.loads(proc.stdout.strip().splitlines()[-1])
    return None if origin is None else Path(origin)


def _hash_b64(algo: str, data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode("ascii")


def installed_record_problems(dist: importlib_metadata.Distribution) -> list[str]:
    """Every installed file RECORD lists with a hash is on disk with that hash and size."""
    files = dist.files
    if files is None:
        return ["the installation has no RECORD"]
    problems: list[str] = []
    for entry in files:
        if entry.hash is None:
            continue
        located = Path(str(dist.locate_file(entry)))
        try:
            data = located.read_bytes()
        except OSError:
            problems.append(f"{entry.as_posix()} is listed in RECORD but missing")
            continue
        if entry.hash.mode not in ("sha256", "sha384", "sha512"):
            problems.append(f"{entry.as_posix()} is hashed with {entry.hash.mode!r} in RECORD")
        elif _hash_b64(entry.hash.mode, data) != entry.hash.value.rstrip("="):
            problems.append(f"{entry.as_posix()} was modified (its bytes differ from RECORD)")
    return problems


def pinned_record(wheel: Path) -> dict[str, str]:
    """The pinned artifact's RECORD as {path: "algo=hash"} (RECORD and signatures left out)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            record_name = next(
                n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")
            )
            data = zf.read(record_name)
    except (zipfile.BadZipFile, StopIteration, OSError) as exc:
        raise IntegrityError(
            f"{wheel.name}: no readable RECORD: {exc}", tip="delete it and fetch again"
        ) from None
    rows = csv.reader(io.StringIO(data.decode("utf-8")))
    return {row[0]: row[1] for row in rows if len(row) == 3 and row[1]}


def pin_problems(dist: importlib_metadata.Distribution, location: Path, pinned: dict[str, str]) -> list[str]:
    """The installed files against the pinned wheel's RECORD: every pinned file is there with the pinned hash, and
    the installation lists nothing else beyond what an installer writes (bytecode, scripts, INSTALLER, ...)."""
    problems: list[str] = []
    expected: dict[str, str] = {}
    for path, digest in pinned.items():
        top, _, rest = path.partition("/")
        if top.endswith(".data"):
            scheme, _, inner = rest.partition("/")
            if scheme not in ("purelib", "platlib"):
                continue  # scripts are rewritten, headers and data go elsewhere
            path = inner
        expected[path] = digest
    for path, digest in sorted(expected.items()):
        algo, _, value = digest.partition("=")
        try:
            data = (location / path).read_bytes()
        except OSError:
            problems.append(f"{path} is in the pinned wheel but not installed")
            continue
        if algo not in ("sha256", "sha384", "sha512") or _hash_b64(algo, data) != value.rstrip("="):
            problems.append(f"{path} differs from the pinned wheel")
    for entry in dist.files or []:
        name = entry.as_posix()
        if name in expected or name.startswith("../") or "__pycache__/" in name:
            continue
        top, _, rest = name.partition("/")
        if top.endswith(".dist-info") and rest in _INSTALLER_FILES:
            continue
        problems.append(f"{name} is installed but not in the pinned wheel")
    return problems


def _tags(dist: importlib_metadata.Distribution) -> frozenset[str]:
    text = dist.read_text("WHEEL") or ""
    return frozenset(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:"))


def artifact_for(
    manifest: Manifest, tags: frozenset[str], provenance: dict[str, Any] | None
) -> Artifact | None:
    """The pinned wheel an installation came from: the one overlay.json names, else the one with its tags."""
    wheels = [a for a in manifest.upstream.artifacts if a.is_wheel]
    if provenance is not None:
        named = (provenance.get("upstream") or {}).get("artifact") or {}
        return next((a for a in wheels if a.filename == named.get("filename")), None)
    for artifact in wheels:
        if {str(t) for t in parse_wheel_filename(artifact.filename)[3]} == set(tags):
            return artifact
    return wheels[0] if len(wheels) == 1 else None


def inspect_engine(target: Target, manifest: Manifest, *, stock_wheel: Path | None) -> Installed | None:
    """The installation of ``manifest``'s distribution that ``target`` imports (the first on its sys.path), or None.
    ``stock_wheel``: the cached pinned artifact to compare a stock installation with (None: not compared)."""
    found = list(importlib_metadata.distributions(name=manifest.distribution, path=list(target.path)))
    seen: list[importlib_metadata.Distribution] = []
    for d in found:  # one folder can be reached through two sys.path entries
        if all(
            Path(str(d.locate_file(""))).resolve() != Path(str(o.locate_file(""))).resolve() for o in seen
        ):
            seen.append(d)
    if not seen:
        return None
    dist = seen[0]
    location = Path(str(dist.locate_file(""))).resolve()
    dist_info = next(
        (
            Path(str(dist.locate_file(f))).parent.name
            for f in dist.files or []
            if f.as_posix().endswith(".dist-info/METADATA")
        ),
        f"{manifest.distribution}.dist-info",
    )
    provenance = _provenance(dist, manifest)
    tags = _tags(dist)
    try:
        public = Version(dist.version).public
        same_release = Version(public) == Version(manifest.upstream.version)
    except InvalidVersion:
        same_release = False
    kind: Kind = (
        "patched"
        if provenance is not None and same_release
        else ("stock" if provenance is None and dist.version == manifest.upstream.version else "other")
    )
    problems = installed_record_problems(dist)
    pins: list[str] = []
    checked = False
    if kind == "stock" and stock_wheel is not None:
        pins = pin_problems(dist, location, pinned_record(stock_wheel))
        checked = True
    direct = dist.read_text("direct_url.json")
    editable = bool(direct and '"editable": true' in direct.replace("'", '"').lower())
    return Installed(
        engine=manifest.name,
        distribution=canonicalize_name(manifest.distribution),
        version=dist.version,
        location=location,
        dist_info=dist_info,
        kind=kind,
        tags=tags,
        provenance=provenance,
        record_problems=tuple(problems),
        pin_problems=tuple(pins),
        pin_checked=checked,
        editable=editable,
        shadowed=tuple(str(Path(str(d.locate_file(""))).resolve()) for d in seen[1:]),
    )


def _provenance(dist: importlib_metadata.Distribution, manifest: Manifest) -> dict[str, Any] | None:
    text = dist.read_text(PROVENANCE_FILE)
    if text is None:
        return None
    where = f"installed {manifest.distribution} {dist.version}"
    try:
        data = validate(json.loads(text), where)
    except json.JSONDecodeError as exc:
        raise IntegrityError(f"{where}: {PROVENANCE_FILE} is not JSON: {exc}") from None
    check_label(data, dist.version, where)
    return data


def describe(problems: tuple[str, ...] | list[str]) -> str:
    shown = "; ".join(problems[:_MAX_LISTED])
    return shown + (f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else "")
