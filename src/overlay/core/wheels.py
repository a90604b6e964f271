"""Read, rewrite and write wheels deterministically.

Reading validates the archive (CRC; every member through overlay.core.archive_policy; RECORD hashes and sizes). Writing sorts members
(the .dist-info folder last, RECORD last of all), uses fixed timestamps (SOURCE_DATE_EPOCH, clamped to 1980) and fixed
permissions, and regenerates RECORD, so the same inputs give byte-identical wheels.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import stat
import time
import zipfile
import zlib
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from installer.records import Hash, InvalidRecordEntry, RecordEntry, parse_record_file
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from overlay.core.archive_policy import (
    SIGNATURES,
    STRICT,
    MemberPolicy,
    check_control,
    check_members,
    check_wheel_layout,
    zip_kind,
)
from overlay.core.patching import MemoryTree
from overlay.errors import ConfigError, IntegrityError
from overlay.fsutil import atomic_write_bytes

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class WheelName:
    distribution: str  # as spelled in the file name (underscores)
    version: Version
    build: str
    tags: str  # "py3-none-any"

    @classmethod
    def parse(cls, filename: str) -> WheelName:
        _name, version, build, _tags = parse_wheel_filename(filename)
        parts = filename[: -len(".whl")].split("-")
        return cls(
            distribution=parts[0],
            version=version,
            build="-".join(str(b) for b in build) if build else "",
            tags="-".join(parts[-3:]),
        )

    def filename(self, version: str | Version | None = None) -> str:
        ver = str(version if version is not None else self.version).replace("-", "_")
        mid = f"-{self.build}" if self.build else ""
        return f"{self.distribution}-{ver}{mid}-{self.tags}.whl"


@dataclass
class WheelContents:
    """An unpacked wheel: its files as a MemoryTree plus where its metadata lives."""

    name: WheelName
    tree: MemoryTree
    dist_info: str  # "mlx_lm-0.32.2.dist-info"

    @property
    def metadata(self) -> bytes:
        data = self.tree.read(f"{self.dist_info}/METADATA")
        assert data is not None
        return data

    def metadata_field(self, key: str) -> str | None:
        msg = HeaderParser().parsestr(self.metadata.decode("utf-8"))
        value = msg.get(key)
        return str(value) if value is not None else None


def read_wheel(path: Path, *, policy: MemberPolicy = STRICT) -> WheelContents:
    """Read and validate a wheel. IntegrityError (exit 5) for a corrupt, truncated or unsafe archive.

    Every member passes the archive policy (overlay.core.archive_policy: no ``.git`` paths, links or special files, no
    names colliding after case folding or normalisation, one ``.dist-info``, no ``.data`` or root ``.pth`` unless
    ``policy`` allows it) before any member is read, and RECORD must list every file with its sha256 and size."""
    try:
        name = WheelName.parse(path.name)
    except Exception as exc:  # packaging raises InvalidWheelFilename
        raise IntegrityError(f"{path.name} is not a valid wheel file name: {exc}") from None
    where = path.name
    tree = MemoryTree()
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {info.filename: info for info in zf.infolist()}
            files = check_members(((i.filename, zip_kind(i)) for i in zf.infolist()), where=where)
            dist_info = _find_dist_info(name, [str(rel) for _n, rel in files], where)
            check_wheel_layout(
                [str(rel) for _n, rel in files], dist_info=dist_info, where=where, policy=policy
            )
            for member, rel in files:
                info = infos[member]
                data = zf.read(info)  # checks the CRC
                mode = (info.external_attr >> 16) & 0xFFFF
                tree.write(str(rel), data, executable=bool(mode & stat.S_IXUSR))
    except zipfile.BadZipFile as exc:
        raise IntegrityError(
            f"{path} is corrupt or truncated: {exc}", tip="delete it and fetch again"
        ) from None
    except (zlib.error, EOFError) as exc:
        raise IntegrityError(f"{path} is corrupt: {exc}", tip="delete it and fetch again") from None
    contents = WheelContents(name=name, tree=tree, dist_info=dist_info)
    if (
        tree.read(f"{contents.dist_info}/METADATA") is None
        or tree.read(f"{contents.dist_info}/WHEEL") is None
    ):
        raise IntegrityError(f"{path.name}: {contents.dist_info} lacks METADATA or WHEEL")
    verify_record(tree, dist_info, where=where)
    if "wheel-tags" not in policy.allow:
        _check_wheel_tags(contents)
    return contents


def _find_dist_info(name: WheelName, paths: list[str], where: str) -> str:
    dist_infos = sorted({p.split("/", 1)[0] for p in paths if p.split("/", 1)[0].endswith(".dist-info")})
    expected = f"{name.distribution}-{name.version}.dist-info"
    matching = [d for d in dist_infos if _same_dist_info(d, expected)]
    if len(matching) != 1:
        raise IntegrityError(f"{where}: expected one dist-info folder like {expected!r}, found {dist_infos}")
    return matching[0]


_RECORD_HASHES = ("sha256", "sha384", "sha512")


def parse_record(data: bytes, *, where: str) -> dict[str, tuple[str, str]]:
    """RECORD rows as {path: (hash, size)}, parsed and checked element by element with ``installer`` (pypa's wheel
    installer: CSV rows of three elements, hashes as ``name=value``, sizes as integers); IntegrityError for a
    malformed RECORD or a path listed twice."""
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise IntegrityError(f"{where}: RECORD is not UTF-8: {exc}") from None
    record: dict[str, tuple[str, str]] = {}
    try:
        for path, digest, size in parse_record_file(line for line in lines if line.strip()):
            RecordEntry.from_elements(path, digest, size)  # the element checks an installer makes
            if path in record:
                raise IntegrityError(f"{where}: RECORD lists {path!r} twice")
            record[path] = (digest, size)
    except (InvalidRecordEntry, csv.Error) as exc:
        raise IntegrityError(f"{where}: RECORD is malformed: {exc}") from None
    return record


def record_problem(path: str, data: bytes, entry: tuple[str, str] | None) -> str | None:
    """Why ``data`` at ``path`` does not match its RECORD ``entry`` (None when it does)."""
    if entry is None:
        return f"{path!r} is not listed in RECORD"
    digest, size = entry
    if not digest:
        return f"RECORD gives no hash for {path!r}"
    expected = Hash.parse(digest)
    if expected.name not in _RECORD_HASHES:
        return f"RECORD hashes {path!r} with {expected.name!r}; only {', '.join(_RECORD_HASHES)} are accepted"
    if not expected.validate(data):
        actual = (
            base64.urlsafe_b64encode(hashlib.new(expected.name, data).digest()).rstrip(b"=").decode("ascii")
        )
        return f"{path!r} does not match its RECORD hash ({digest}, the file has {expected.name}={actual})"
    if not size.strip():
        return f"RECORD gives no size for {path!r}"
    if size.strip() != str(len(data)):
        return f"{path!r} is {len(data)} bytes, RECORD says {size}"
    return None


def record_exempt(path: str, dist_info: str) -> bool:
    """RECORD itself and its signatures are listed without a hash (wheel spec)."""
    return path == f"{dist_info}/RECORD" or path in {f"{dist_info}/{s}" for s in SIGNATURES}


def verify_record(tree: MemoryTree, dist_info: str, *, where: str) -> None:
    """Every file is in RECORD with a matching hash and size, and RECORD names no file the archive lacks."""
    data = tree.read(f"{dist_info}/RECORD")
    if data is None:
        raise IntegrityError(
            f"{where}: {dist_info} has no RECORD",
            tip="a wheel without RECORD cannot be verified; use another artifact",
        )
    record = parse_record(data, where=where)
    tip = "the archive was changed after it was built: fetch it again, or rebuild it"
    for path in sorted(tree.files):
        if record_exempt(path, dist_info):
            continue
        problem = record_problem(path, tree.files[path], record.get(path))
        if problem:
            raise IntegrityError(f"{where}: {problem}", tip=tip)
    for path in sorted(record):
        if path not in tree.files and not record_exempt(path, dist_info):
            raise IntegrityError(
                f"{where}: RECORD lists {path!r}, which the archive does not contain", tip=tip
            )


def repo_layout_files(contents: WheelContents, package_root: str) -> dict[str, bytes]:
    """The wheel's package files (``.dist-info`` and ``.data`` left out) at git-repository-root paths: how checkout
    lays out its base commit. A ``.git`` path never gets here (read_wheel refused it); checked again all the same."""
    prefix = package_root.strip("/")
    files: dict[str, bytes] = {}
    for rel, data in contents.tree.files.items():
        top = rel.split("/", 1)[0]
        if top.endswith((".dist-info", ".data")):
            continue
        check_control(rel, where=contents.name.filename())
        files[f"{prefix}/{rel}" if prefix else rel] = data
    return files


def _same_dist_info(found: str, expected: str) -> bool:
    f_name, _, f_ver = found[: -len(".dist-info")].rpartition("-")
    e_name, _, e_ver = expected[: -len(".dist-info")].rpartition("-")
    return canonicalize_name(f_name) == canonicalize_name(e_name) and Version(f_ver) == Version(e_ver)


def _check_wheel_tags(contents: WheelContents) -> None:
    data = contents.tree.read(f"{contents.dist_info}/WHEEL") or b""
    msg = HeaderParser().parsestr(data.decode("utf-8"))
    declared = {str(t) for t in msg.get_all("Tag") or []}
    _n, _v, _b, tags = parse_wheel_filename(contents.name.filename())
    in_name = {str(t) for t in tags}
    if declared and declared != in_name:
        raise IntegrityError(
            f"{contents.name.filename()}: WHEEL declares tags {sorted(declared)} but the file name says {sorted(in_name)}",
            tip="if the upstream release really ships it so (renamed after the build), say so in the manifest: "
            'upstream.allow-members = ["wheel-tags"] (docs/commands/apply.md)',
        )


def set_version(contents: WheelContents, new_version: str) -> WheelContents:
    """Return a copy with the distribution version changed: dist-info/.data renamed, METADATA rewritten."""
    old = contents.name.version
    dist = contents.dist_info[: -len(".dist-info")].rpartition("-")[0]
    new_dist_info = f"{dist}-{new_version}.dist-info"
    old_data = f"{dist}-{contents.dist_info[: -len('.dist-info')].rpartition('-')[2]}.data"
    new_data = f"{dist}-{new_version}.data"
    tree = MemoryTree()
    for path, data in contents.tree.files.items():
        top, sep, rest = path.partition("/")
        if top == contents.dist_info:
            path = f"{new_dist_info}/{rest}"
        elif top == old_data:
            path = f"{new_data}/{rest}"
        tree.write(path, data, executable=contents.tree.is_executable(f"{top}{sep}{rest}"))
    meta_path = f"{new_dist_info}/METADATA"
    tree.write(meta_path, _rewrite_version(tree.files[meta_path], str(old), new_version))
    name = WheelName(
        distribution=contents.name.distribution,
        version=Version(new_version),
        build=contents.name.build,
        tags=contents.name.tags,
    )
    return WheelContents(name=name, tree=tree, dist_info=new_dist_info)


def _rewrite_version(metadata: bytes, old: str, new: str) -> bytes:
    lines = metadata.split(b"\n")
    for i, line in enumerate(lines):
        if line == b"":
            break  # end of headers; the description follows
        if line.lower().startswith(b"version:"):
            value = line.split(b":", 1)[1].strip().decode("utf-8", "replace")
            try:
                same = Version(value) == Version(old)
            except (InvalidVersion, ValueError):
                same = False
            if not same:
                raise IntegrityError(f"METADATA says Version: {value}, but the wheel file name says {old}")
            lines[i] = b"Version: " + new.encode()
            return b"\n".join(lines)
    raise IntegrityError("METADATA has no Version: header")


def retag(contents: WheelContents, tag: str) -> WheelContents:
    """Give the wheel another compatibility tag (e.g. once it carries a compiled extension): file name and WHEEL's
    Tag lines follow, and a platform tag makes it non-pure (Root-Is-Purelib: false)."""
    parts = tag.split("-")
    if len(parts) != 3 or not all(parts):
        raise IntegrityError(f"wheel tag {tag!r} is not of the form python-abi-platform")
    wheel_path = f"{contents.dist_info}/WHEEL"
    lines = (contents.tree.read(wheel_path) or b"").decode("utf-8").splitlines()
    out = [line for line in lines if not line.startswith("Tag:")]
    if parts[2] != "any":
        out = [("Root-Is-Purelib: false" if line.startswith("Root-Is-Purelib:") else line) for line in out]
    out.append(f"Tag: {tag}")
    contents.tree.write(wheel_path, ("\n".join(out) + "\n").encode("utf-8"))
    contents.name = WheelName(
        distribution=contents.name.distribution,
        version=contents.name.version,
        build=contents.name.build,
        tags=tag,
    )
    _check_wheel_tags(contents)
    return contents


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"sha256={digest}"


def member_order(paths: list[str], dist_info: str) -> list[str]:
    """Sorted, with the .dist-info folder last and its RECORD the very last member."""
    record = f"{dist_info}/RECORD"
    body = sorted(p for p in paths if not p.startswith(dist_info + "/"))
    meta = sorted(p for p in paths if p.startswith(dist_info + "/") and p != record)
    return body + meta + [record]


def build_record(tree: MemoryTree, dist_info: str) -> bytes:
    record = f"{dist_info}/RECORD"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for path in member_order([p for p in tree.files if p != record], dist_info)[:-1]:
        data = tree.files[path]
        writer.writerow([path, record_hash(data), str(len(data))])
    writer.writerow([record, "", ""])
    return buf.getvalue().encode("utf-8")


def zip_date_time() -> tuple[int, int, int, int, int, int]:
    """The members' timestamp: SOURCE_DATE_EPOCH clamped to what a zip can hold (1980-01-01 .. 2107-12-31), else
    1980-01-01. A value that is not a whole number of seconds is refused (ConfigError naming it)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is None or not epoch.strip():
        return _ZIP_EPOCH
    value = epoch.strip()
    digits = value[1:] if value[:1] in "+-" else value
    if not (digits.isascii() and digits.isdigit()):
        raise ConfigError(
            f"SOURCE_DATE_EPOCH={epoch[:40]!r} is not a whole number of seconds since 1970",
            tip="set it to an integer (e.g. `export SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)`) or unset it",
        )
    seconds = int(value) if len(digits) <= 18 else (-1 if value.startswith("-") else _ZIP_MAX_SECONDS)
    t = time.gmtime(min(max(seconds, _ZIP_MIN_SECONDS), _ZIP_MAX_SECONDS))
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec)


_ZIP_MIN_SECONDS = 315532800  # 1980-01-01T00:00:00Z, the first time a zip member can carry
_ZIP_MAX_SECONDS = 4354819198  # 2107-12-31T23:59:58Z, the last (DOS time has a 2-second resolution)


def write_wheel(contents: WheelContents, out_dir: Path, *, compresslevel: int = 6) -> Path:
    """Write ``contents`` as ``out_dir/<name>.whl`` deterministically (RECORD regenerated), atomically."""
    tree = contents.tree
    tree.write(f"{contents.dist_info}/RECORD", build_record(tree, contents.dist_info))
    order = member_order(list(tree.files), contents.dist_info)
    date_time = zip_date_time()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=compresslevel) as zf:
        for path in order:
            info = zipfile.ZipInfo(path, date_time=date_time)
            info.create_system = 3
            mode = 0o755 if tree.is_executable(path) else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(
                info, tree.files[path], compress_type=zipfile.ZIP_DEFLATED, compresslevel=compresslevel
            )
    out = out_dir / contents.name.filename()
    atomic_write_bytes(out, buf.getvalue())
    return out


def wheel_tag_objects(contents: WheelContents) -> frozenset[Tag]:
    return parse_wheel_filename(contents.name.filename())[3]
