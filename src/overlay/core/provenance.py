"""overlay.json: the provenance of a patched wheel, written into its .dist-info and read back from a wheel file or
an installed distribution."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from overlay import __version__
from overlay.core.manifest import Artifact, Manifest
from overlay.core.series import Patch, series_hash
from overlay.core.versions import ordered_local_version, series_order
from overlay.errors import IntegrityError, UsageError
from overlay.schemas.documents import ArtifactSource, GitSource
from overlay.schemas.documents import Provenance as ProvenanceDoc

PROVENANCE_FILE = "overlay.json"
SCHEMA_VERSION: Literal[1] = 1


def local_version(manifest: Manifest, patches: Sequence[Patch], *, root: Path | None = None) -> str:
    """``UPSTREAM+LABEL.ORDER.N.gHASH8`` (DESIGN; ORDER: overlay.core.versions, with the series' git history when
    ``root`` is given)."""
    return ordered_local_version(
        manifest.upstream.version, manifest.series.label, patches, order=_order(manifest, patches, root)
    )


def _order(manifest: Manifest, patches: Sequence[Patch], root: Path | None) -> int:
    return series_order(patches, root=root, series_dir=None if root is None else manifest.series_dir(root))


def build_provenance(
    manifest: Manifest,
    patches: Sequence[Patch],
    *,
    artifact: Artifact | None,
    source: ArtifactSource | GitSource,
    root: Path | None = None,
) -> ProvenanceDoc:
    return {
        "version": SCHEMA_VERSION,
        "tool": {"name": "overlay", "version": __version__},
        "engine": manifest.name,
        "upstream": {
            "distribution": manifest.distribution if artifact is None else manifest.distribution_of(artifact),
            "version": manifest.upstream.version,
            "commit": source["commit"] if source["kind"] == "git" else manifest.upstream.commit,
            "artifact": None
            if artifact is None
            else {"filename": artifact.filename, "sha256": artifact.sha256},
        },
        "source": source,
        "series": {
            "sha256": series_hash(list(patches)),
            "order": _order(manifest, patches, root),
            "patches": [
                {
                    "name": p.name,
                    "sha256": p.sha256,
                    "subject": p.subject,
                    "theme": p.theme,
                    "numerics": p.numerics,
                    "upstream_status": p.upstream_status,
                }
                for p in patches
            ],
        },
    }


def dumps(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n").encode("utf-8")


@dataclass(frozen=True)
class Provenance:
    data: dict[str, Any]
    where: str  # wheel path or "installed: <dist> at <location>"
    version: str = ""  # the version of the wheel or distribution that carries it
    checked: tuple[str, ...] = ()  # what was verified: "label", "RECORD", "patches"

    @property
    def engine(self) -> str:
        return str(self.data.get("engine"))


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_LOCAL = re.compile(r"^(?P<label>[a-z][a-z0-9]*)\.(?:(?P<order>\d+)\.)?(?P<n>\d+)\.g(?P<hash>[0-9a-f]{8})$")
_FORGED_TIP = "do not install it: rebuild the wheel with `overlay apply ENGINE` from the overlay repository"


def validate(data: Any, where: str) -> dict[str, Any]:
    """The shape of overlay.json (schema version 1); IntegrityError naming the first field that is wrong."""
    if not isinstance(data, dict) or data.get("version") != SCHEMA_VERSION:
        raise IntegrityError(f"{where}: overlay.json is not provenance schema version {SCHEMA_VERSION}")
    for key in ("tool", "engine", "upstream", "series"):
        if key not in data:
            raise IntegrityError(f"{where}: overlay.json lacks {key!r}")
    if not isinstance(data["tool"], dict) or not isinstance(data["engine"], str):
        raise IntegrityError(f"{where}: overlay.json: 'tool' must be an object and 'engine' a string")
    up = data["upstream"]
    if (
        not isinstance(up, dict)
        or not isinstance(up.get("version"), str)
        or not isinstance(up.get("distribution"), str)
    ):
        raise IntegrityError(f"{where}: overlay.json: 'upstream' needs string 'distribution' and 'version'")
    series = data["series"]
    if (
        not isinstance(series, dict)
        or not isinstance(series.get("sha256"), str)
        or not _HEX64.match(series["sha256"])
    ):
        raise IntegrityError(f"{where}: overlay.json: series.sha256 is not 64 lower-case hex digits")
    patches = series.get("patches")
    if not isinstance(patches, list):
        raise IntegrityError(f"{where}: overlay.json: series.patches is not a list")
    for i, p in enumerate(patches):
        if not (
            isinstance(p, dict)
            and isinstance(p.get("name"), str)
            and isinstance(p.get("sha256"), str)
            and _HEX64.match(p["sha256"])
        ):
            raise IntegrityError(
                f"{where}: overlay.json: series.patches[{i}] needs a 'name' and a 64-hex 'sha256'"
            )
    if "lint" in data and not isinstance(data["lint"], dict):
        raise IntegrityError(f"{where}: overlay.json: 'lint' must be an object")
    return data


def check_label(data: dict[str, Any], version: str, where: str) -> None:
    """overlay.json agrees with the version label ``UPSTREAM+LABEL.N.gHASH8``: same upstream, N patches listed,
    HASH8 the head of series.sha256."""
    try:
        v = Version(version)
    except (InvalidVersion, ValueError):
        raise IntegrityError(
            f"{where}: version {version!r} is not a PEP 440 version", tip=_FORGED_TIP
        ) from None
    m = _LOCAL.match(v.local or "")
    if m is None:
        raise IntegrityError(
            f"{where}: version {version} has no overlay label (UPSTREAM+LABEL.N.gHASH8), but it carries overlay.json",
            tip=_FORGED_TIP,
        )
    upstream = data["upstream"]["version"]
    try:
        same_upstream = Version(upstream) == Version(v.public)
    except (InvalidVersion, ValueError, TypeError):
        same_upstream = False
    if not same_upstream:
        raise IntegrityError(
            f"{where}: version {version} is built on {v.public}, overlay.json says upstream {upstream}",
            tip=_FORGED_TIP,
        )
    listed = len(data["series"]["patches"])
    if int(m["n"]) != listed:
        raise IntegrityError(
            f"{where}: version {version} says {int(m['n'])} patches, overlay.json lists {listed}",
            tip=_FORGED_TIP,
        )
    order = data["series"].get("order")
    if m["order"] is not None and order is not None and int(m["order"]) != order:
        raise IntegrityError(
            f"{where}: version {version} says order {int(m['order'])}, overlay.json says series.order "
            f"{order}",
            tip=_FORGED_TIP,
        )
    if data["series"]["sha256"][:8] != m["hash"]:
        raise IntegrityError(
            f"{where}: version {version} says series hash g{m['hash']}, overlay.json says series.sha256 "
            f"{data['series']['sha256']}",
            tip=_FORGED_TIP,
        )


def read_from_wheel(path: Path) -> Provenance:
    """overlay.json of a wheel file, verified: the archive's RECORD (every file's hash and size, overlay.json's
    included, no file missing or unlisted) and the version label."""
    from overlay.core.archive_policy import ALLOWANCES, MemberPolicy
    from overlay.core.wheels import read_wheel

    if not path.is_file():
        raise UsageError(
            f"{path} does not exist (or is not a file)", tip="pass a .whl path or an installed distribution"
        )
    contents = read_wheel(path, policy=MemberPolicy.of(ALLOWANCES))  # RECORD verified here
    raw = contents.tree.read(f"{contents.dist_info}/{PROVENANCE_FILE}")
    if raw is None:
        raise UsageError(
            f"{path.name} has no .dist-info/{PROVENANCE_FILE}: it is not a wheel built by overlay",
            tip="build one with `overlay apply ENGINE`",
        )
    data = _loads(raw, str(path))
    validate(data, str(path))
    version = str(contents.name.version)
    meta_version = contents.metadata_field("Version")
    if meta_version is None or Version(meta_version) != contents.name.version:
        raise IntegrityError(
            f"{path}: METADATA says Version: {meta_version}, the file name says {version}", tip=_FORGED_TIP
        )
    check_label(data, version, str(path))
    return Provenance(data=data, where=str(path), version=version, checked=("RECORD", "label"))


def _loads(raw: bytes | str, where: str) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{where}: {PROVENANCE_FILE} is not JSON: {exc}", tip=_FORGED_TIP) from None


def read_from_installed(distribution: str, *, path: Sequence[str] | None = None) -> Provenance:
    """overlay.json of an installed distribution, verified: the files on disk against the installed RECORD, and the
    version label."""
    try:
        if path is None:
            dist = importlib_metadata.distribution(distribution)
        else:
            found = list(importlib_metadata.distributions(name=distribution, path=list(path)))
            if not found:
                raise importlib_metadata.PackageNotFoundError(distribution)
            dist = found[0]
    except importlib_metadata.PackageNotFoundError:
        raise UsageError(
            f"no installed distribution named {distribution!r} and no such wheel file",
            tip="pass a .whl path, or the name of a distribution installed in this Python",
        ) from None
    text = dist.read_text(PROVENANCE_FILE)
    if text is None:
        raise UsageError(
            f"{distribution} {dist.version} is installed but carries no {PROVENANCE_FILE}: it is the stock distribution",
            tip="install a wheel built by `overlay apply`",
        )
    where = f"installed {distribution}"
    data = _loads(text, where)
    validate(data, where)
    verify_installed_record(dist, where)
    check_label(data, dist.version, where)
    location = getattr(dist, "_path", "?")
    return Provenance(
        data=data,
        where=f"installed: {distribution} {dist.version} ({location})",
        version=dist.version,
        checked=("RECORD", "label"),
    )


def verify_installed_record(dist: importlib_metadata.Distribution, where: str) -> None:
    """Every file the installed RECORD lists with a hash is on disk with that hash and size; overlay.json is listed
    with a hash."""
    import base64
    import hashlib

    files = dist.files
    tip = "the installed files were changed after installation: reinstall the wheel (`pip install --force-reinstall`)"
    if files is None:
        raise IntegrityError(
            f"{where}: the distribution has no RECORD; its files cannot be verified", tip=tip
        )
    hashed_provenance = False
    for entry in files:
        name = entry.as_posix()
        if name.endswith(f".dist-info/{PROVENANCE_FILE}") and name.count("/") == 1:
            hashed_provenance = entry.hash is not None
        if entry.hash is None:
            continue
        located = Path(str(dist.locate_file(entry)))
        try:
            data = located.read_bytes()
        except OSError:
            raise IntegrityError(
                f"{where}: RECORD lists {name!r}, which is not on disk at {located}", tip=tip
            ) from None
        algo = entry.hash.mode
        if algo not in ("sha256", "sha384", "sha512"):
            raise IntegrityError(
                f"{where}: RECORD hashes {name!r} with {algo!r}; only sha256 or stronger is accepted", tip=tip
            )
        actual = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode("ascii")
        if actual != entry.hash.value.rstrip("="):
            raise IntegrityError(
                f"{where}: {name!r} does not match its RECORD hash ({algo}={entry.hash.value}, "
                f"the file has {algo}={actual})",
                tip=tip,
            )
        if entry.size is not None and entry.size != len(data):
            raise IntegrityError(f"{where}: {name!r} is {len(data)} bytes, RECORD says {entry.size}", tip=tip)
    if not hashed_provenance:
        raise IntegrityError(
            f"{where}: {PROVENANCE_FILE} is not listed in RECORD with a hash", tip=_FORGED_TIP
        )


def verify_against_root(prov: Provenance, root: Path) -> Provenance:
    """``--verify``: every patch named in overlay.json is, in order, the patch of ``series`` in the overlay repository at
    ``root`` with the same name and sha256, the series hash recomputes from those files, and the upstream pin agrees.
    IntegrityError (exit 5) naming the first patch (or field) that differs."""
    from overlay.core.inputs import check_name, read_inside
    from overlay.core.manifest import load_engine
    from overlay.core.series import parse_series_file

    data = prov.data
    manifest = load_engine(root, prov.engine)
    series_dir = manifest.series_dir(root)
    series = parse_series_file(series_dir / "series", root=root)
    rel_dir = series_dir.relative_to(root) if series_dir.is_relative_to(root) else series_dir
    tip = (
        f"the wheel was not built from this checkout's {rel_dir}: rebuild it (`overlay apply {manifest.name}`), "
        "or verify against the checkout it was built from (--root DIR)"
    )
    up = data["upstream"]
    if up["version"] != manifest.upstream.version:
        raise IntegrityError(
            f"{prov.where}: built on {manifest.name} {up['version']}, {manifest.path.name} pins "
            f"{manifest.upstream.version}",
            tip=tip,
        )
    art = up.get("artifact")
    if isinstance(art, dict):
        pinned = {a.filename: a.sha256 for a in manifest.upstream.artifacts}
        if pinned.get(str(art.get("filename"))) != art.get("sha256"):
            raise IntegrityError(
                f"{prov.where}: upstream artifact {art.get('filename')} sha256={art.get('sha256')} is "
                f"not pinned in {manifest.path.name}",
                tip=tip,
            )
    digest = hashlib.sha256()
    for index, entry in enumerate(data["series"]["patches"]):
        name = check_name(entry["name"], what="patch name in overlay.json", error=IntegrityError)
        expected = series.names[index] if index < len(series.names) else None
        if expected != name:
            raise IntegrityError(
                f"{prov.where}: patch {index + 1} is {name!r} in overlay.json, but {rel_dir}/series has "
                f"{expected!r} there",
                tip=tip,
            )
        try:
            raw = read_inside(root, series_dir / name, what="patch file")
        except FileNotFoundError:
            raise IntegrityError(
                f"{prov.where}: patch {name} is in overlay.json, but {rel_dir}/{name} does not exist", tip=tip
            ) from None
        actual = hashlib.sha256(raw).hexdigest()
        if actual != entry["sha256"]:
            raise IntegrityError(
                f"{prov.where}: patch {name} has sha256 {entry['sha256']} in overlay.json, but "
                f"{rel_dir}/{name} has {actual}",
                tip=tip,
            )
        digest.update(raw)
    if digest.hexdigest() != data["series"]["sha256"]:
        raise IntegrityError(
            f"{prov.where}: series.sha256 {data['series']['sha256']} in overlay.json is not the hash of "
            f"the patches it lists ({digest.hexdigest()})",
            tip=_FORGED_TIP,
        )
    return Provenance(data=data, where=prov.where, version=prov.version, checked=(*prov.checked, "patches"))


def summary_lines(prov: Provenance) -> list[str]:
    d = prov.data
    up = d["upstream"]
    art = up.get("artifact") or {}
    lines = [
        f"engine:   {d['engine']}",
        f"upstream: {up['distribution']} {up['version']}"
        + (f" (commit {up['commit']})" if up.get("commit") else ""),
    ]
    if art:
        lines.append(f"artifact: {art.get('filename')} sha256={art.get('sha256')}")
    src = d.get("source") or {}
    if src:
        lines.append("source:   " + ", ".join(f"{k}={v}" for k, v in src.items()))
    lines.append(f"series:   {len(d['series']['patches'])} patches, sha256={d['series']['sha256']}")
    for p in d["series"]["patches"]:
        lines.append(f"  {p['name']}  [{p.get('theme')}/{p.get('numerics')}]  {p.get('subject')}")
    lint = d.get("lint") or {}
    if lint.get("allowed_unlinted"):
        problems = lint.get("problems") or []
        lines.append(f"lint:     built with --allow-unlinted; {len(problems)} lint problems")
        for p in problems:
            lines.append(f"  {p.get('patch') or '(series)'}: {p.get('message')}")
    lines.append(f"tool:     {d['tool']['name']} {d['tool']['version']}")
    if prov.checked:
        lines.append("verified: " + ", ".join(_CHECKED[c] for c in prov.checked))
    return lines


_CHECKED = {
    "RECORD": "every file against RECORD",
    "label": "overlay.json against the version label",
    "patches": "the patches against patches/ in the overlay repository",
}
