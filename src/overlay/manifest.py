"""overlays/ENGINE.toml: the pin and recipe of one engine, parsed strictly into frozen data.

Unknown keys, wrong types, bad hashes and missing fields raise ConfigError (exit 2) naming the file, the key and,
for unknown keys, the closest known one.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import (
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from overlay.errors import ConfigError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_LABEL = re.compile(r"^[a-z][a-z0-9]*$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class Artifact:
    filename: str
    sha256: str
    url: str | None = None

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")


@dataclass(frozen=True)
class Upstream:
    version: str
    git: str
    tag: str | None
    commit: str | None
    package_root: str
    artifacts: tuple[Artifact, ...]

    @property
    def primary(self) -> Artifact:
        """The artifact the patched wheel is built from: the first wheel, else the first sdist."""
        for artifact in self.artifacts:
            if artifact.is_wheel:
                return artifact
        return self.artifacts[0]


@dataclass(frozen=True)
class SeriesSpec:
    dir: str
    label: str


@dataclass(frozen=True)
class Runtime:
    """What an arm (stock or patched install) needs to run, besides the engine wheel itself."""

    requirements: tuple[str, ...] = ()
    preload: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    python_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckSpec:
    """Budgets of `overlay check` for patches of the approximate numerics class."""

    kld_max: float = 1e-3
    top1_min: float = 0.99
    default_model: str | None = None


@dataclass(frozen=True)
class Prebuilt:
    """`overlay apply --prebuilt`: a command that compiles the engine's native parts from the patched tree.

    ``command`` placeholders: {python} (the interpreter that builds), {tree} (the patched wheel tree, wheel layout),
    {out} (a folder whose files are added to the wheel, paths kept), {info} (a JSON file the command may write with
    build details, copied into the provenance), {root} (the overlay repository). ``tag`` is the wheel tag of the
    result; {py} stands for the building interpreter's major+minor (e.g. 311).
    """

    command: tuple[str, ...]
    tag: str
    description: str = ""


@dataclass(frozen=True)
class Manifest:
    path: Path
    name: str
    distribution: str
    import_name: str
    upstream: Upstream
    series: SeriesSpec
    runtime: Runtime = field(default_factory=Runtime)
    check: CheckSpec = field(default_factory=CheckSpec)
    prebuilt: Prebuilt | None = None

    def series_dir(self, root: Path) -> Path:
        return root / self.series.dir


_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "engine": {"name": str, "distribution": str, "import-name": str},
    "upstream": {
        "version": str,
        "git": str,
        "tag": str,
        "commit": str,
        "package-root": str,
        "artifacts": list,
    },
    "series": {"dir": str, "label": str},
    "runtime": {"requirements": list, "preload": list, "env": dict, "python-path": list},
    "check": {"kld-max": (float, int), "top1-min": (float, int), "default-model": str},
    "prebuilt": {"command": list, "tag": str, "description": str},
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "engine": ("name", "distribution", "import-name"),
    "upstream": ("version", "git", "package-root", "artifacts"),
    "series": ("dir", "label"),
    "runtime": (),
    "check": (),
    "prebuilt": (),
}
_ARTIFACT_KEYS = {"filename": str, "sha256": str, "url": str}



def artifact_name_parts(filename: str) -> tuple[str, Version]:
    """(distribution, version) from a wheel or sdist file name; ValueError (packaging's) when it is neither."""
    if filename.endswith(".whl"):
        dist, version, _build, _tags = parse_wheel_filename(filename)
        return dist, version
    return parse_sdist_filename(filename)

def _closest(key: str, known: list[str]) -> str:
    match = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else f" (known keys: {', '.join(known)})"


def _check_keys(where: str, table: Mapping[str, Any], known: Mapping[str, Any], path: Path) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{path}: unknown key {where}{key!r}{_closest(key, list(known))}")


def _typed(where: str, key: str, value: Any, expected: type | tuple[type, ...], path: Path) -> Any:
    if isinstance(value, bool) or not isinstance(value, expected):
        names = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
        raise ConfigError(f"{path}: {where}{key} must be a {names}, got {value!r}")
    return value


def _str_list(where: str, key: str, value: Any, path: Path) -> tuple[str, ...]:
    _typed(where, key, value, list, path)
    for item in value:
        _typed(where, key + "[]", item, str, path)
    return tuple(value)


def load_manifest(path: Path) -> Manifest:
    """Parse and validate one manifest file."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"manifest {path} does not exist", tip="list engines with `overlay list`") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    _check_keys("", raw, _SCHEMA, path)
    tables: dict[str, dict[str, Any]] = {}
    for section, keys in _SCHEMA.items():
        table = raw.get(section)
        if table is None:
            if _REQUIRED[section]:
                raise ConfigError(f"{path}: missing table [{section}]")
            table = {}
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{section}] must be a table")
        _check_keys(f"{section}.", table, keys, path)
        for key in _REQUIRED[section]:
            if key not in table:
                raise ConfigError(f"{path}: missing required key {section}.{key}")
        for key, value in table.items():
            _typed(f"{section}.", key, value, keys[key], path)
        tables[section] = table

    eng, up, ser = tables["engine"], tables["upstream"], tables["series"]
    name = eng["name"]
    if not _NAME.match(name):
        raise ConfigError(f"{path}: engine.name {name!r} must be lower-case letters, digits, '.', '_' or '-'")
    if path.stem != name:
        raise ConfigError(f"{path}: engine.name {name!r} differs from the file name {path.stem!r}; rename one")
    try:
        version = Version(up["version"])
    except InvalidVersion:
        raise ConfigError(f"{path}: upstream.version {up['version']!r} is not a PEP 440 version") from None
    if version.local is not None:
        raise ConfigError(f"{path}: upstream.version {up['version']!r} already has a local label; pin a public release")
    commit = up.get("commit")
    if commit is not None and not _COMMIT.match(commit):
        raise ConfigError(f"{path}: upstream.commit {commit!r} is not a full 40-hex git commit id")
    package_root = up["package-root"].strip("/")
    if ".." in package_root.split("/") or up["package-root"].startswith("/"):
        raise ConfigError(f"{path}: upstream.package-root {up['package-root']!r} must be a relative folder")
    artifacts = tuple(
        _parse_artifact(i, a, path, distribution=eng["distribution"], version=version)
        for i, a in enumerate(up["artifacts"])
    )
    if not artifacts:
        raise ConfigError(f"{path}: upstream.artifacts is empty; pin at least one release file")
    names = [a.filename for a in artifacts]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: upstream.artifacts lists a file twice: {names}")
    label = ser["label"]
    if not _LABEL.match(label):
        raise ConfigError(f"{path}: series.label {label!r} must be lower-case letters and digits, starting with a letter")
    rt = tables["runtime"]
    env = rt.get("env", {})
    for key, value in env.items():
        _typed("runtime.env.", key, value, str, path)
    ck = tables["check"]
    pb = tables["prebuilt"]
    prebuilt = None
    if pb:
        for key in ("command", "tag"):
            if key not in pb:
                raise ConfigError(f"{path}: missing required key prebuilt.{key}")
        command = _str_list("prebuilt.", "command", pb["command"], path)
        if not command:
            raise ConfigError(f"{path}: prebuilt.command is empty")
        prebuilt = Prebuilt(command=command, tag=pb["tag"], description=pb.get("description", ""))
    return Manifest(
        path=path,
        name=name,
        distribution=eng["distribution"],
        import_name=eng["import-name"],
        upstream=Upstream(
            version=str(version),
            git=up["git"],
            tag=up.get("tag"),
            commit=commit,
            package_root=package_root,
            artifacts=artifacts,
        ),
        series=SeriesSpec(dir=ser["dir"], label=label),
        runtime=Runtime(
            requirements=_str_list("runtime.", "requirements", rt.get("requirements", []), path),
            preload=_str_list("runtime.", "preload", rt.get("preload", []), path),
            env=tuple(sorted(env.items())),
            python_path=_str_list("runtime.", "python-path", rt.get("python-path", []), path),
        ),
        check=CheckSpec(
            kld_max=float(ck.get("kld-max", CheckSpec.kld_max)),
            top1_min=float(ck.get("top1-min", CheckSpec.top1_min)),
            default_model=ck.get("default-model"),
        ),
        prebuilt=prebuilt,
    )


def _parse_artifact(index: int, raw: Any, path: Path, *, distribution: str, version: Version) -> Artifact:
    where = f"upstream.artifacts[{index}]."
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: upstream.artifacts[{index}] must be a table")
    _check_keys(where, raw, _ARTIFACT_KEYS, path)
    for key in ("filename", "sha256"):
        if key not in raw:
            raise ConfigError(f"{path}: missing required key {where}{key}")
    for key, value in raw.items():
        _typed(where, key, value, _ARTIFACT_KEYS[key], path)
    filename, sha = raw["filename"], raw["sha256"]
    if not _SHA256.match(sha):
        raise ConfigError(f"{path}: {where}sha256 {sha!r} is not 64 lower-case hex digits")
    if "/" in filename or "\\" in filename:
        raise ConfigError(f"{path}: {where}filename {filename!r} must be a bare file name")
    try:
        dist, fver = artifact_name_parts(filename)
    except ValueError as exc:
        raise ConfigError(f"{path}: {where}filename {filename!r} is not a wheel or sdist name: {exc}") from None
    from packaging.utils import canonicalize_name

    if canonicalize_name(dist) != canonicalize_name(distribution):
        raise ConfigError(f"{path}: {where}filename {filename!r} is not a {distribution!r} distribution")
    if fver != version:
        raise ConfigError(f"{path}: {where}filename {filename!r} is version {fver}, but upstream.version is {version}")
    return Artifact(filename=filename, sha256=sha, url=raw.get("url"))


def find_root(start: Path) -> Path:
    """Walk up from ``start`` to the first folder holding ``overlays/``."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / "overlays").is_dir():
            return folder
    raise ConfigError(
        f"no overlay repository found: no folder with overlays/ at or above {start}",
        tip="run from inside the repository or pass --root DIR",
    )


def engine_names(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "overlays").glob("*.toml"))


def load_engine(root: Path, name: str) -> Manifest:
    path = root / "overlays" / f"{name}.toml"
    if not path.is_file():
        known = engine_names(root)
        match = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {match[0]!r}? " if match else ""
        raise ConfigError(
            f"unknown engine {name!r}: no {path.relative_to(root)}",
            tip=f"{hint}known engines: {', '.join(known) or '(none)'}",
        )
    return load_manifest(path)
