"""Fast, lean apply: patch a wheel without unpacking it.

The pinned wheel is read once, member by member (archive policy on the names first; every member's bytes streamed
through sha256 against RECORD and through the CRC check, none kept); the patches read only the members they touch.
The patched wheel is then written straight to a file: members no patch changed keep their compressed bytes as they
are (only their header is rewritten: the new name where the dist-info folder is renamed, fixed timestamps and
permissions), changed and new members are compressed, RECORD is regenerated from the verified upstream rows plus
the new hashes. Peak memory is the changed members, not the wheel; the same inputs give the same bytes.
"""

from __future__ import annotations

import hashlib
import stat
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from overlay.core.archive_policy import MemberPolicy, check_members, check_wheel_layout, zip_kind
from overlay.core.wheels import (
    WheelName,
    _find_dist_info,
    _rewrite_version,
    member_order,
    parse_record,
    record_exempt,
    record_hash,
    record_problem,
    zip_date_time,
)
from overlay.errors import IntegrityError
from overlay.fsutil import publish_file

_CHUNK = 1 << 20
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_END = struct.Struct("<4sHHHHIIH")


@dataclass
class _Member:
    name: str  # in the source archive
    info: zipfile.ZipInfo | None  # None: written by a patch or by us
    data: bytes | None  # new bytes (None: unchanged, copied compressed)
    executable: bool
    record: str  # "sha256=..." of the final bytes
    size: int


class StreamTree:
    """The Tree the patches see: members are read from the archive on demand; writes and deletes are kept here."""

    def __init__(self, zf: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo]) -> None:
        self.zf, self.members = zf, members
        self.changed: dict[str, bytes | None] = {}
        self.exec_bits: dict[str, bool] = {}

    def read(self, path: str) -> bytes | None:
        if path in self.changed:
            return self.changed[path]
        info = self.members.get(path)
        return None if info is None else self.zf.read(info)

    def write(self, path: str, data: bytes, *, executable: bool | None = None) -> None:
        self.changed[path] = data
        if executable is not None:
            self.exec_bits[path] = executable

    def delete(self, path: str) -> None:
        self.changed[path] = None
        self.exec_bits.pop(path, None)

    def is_executable(self, path: str) -> bool:
        if path in self.exec_bits:
            return self.exec_bits[path]
        info = self.members.get(path)
        return bool(info is not None and (info.external_attr >> 16) & stat.S_IXUSR)


def open_verified(
    path: Path, *, policy: MemberPolicy
) -> tuple[zipfile.ZipFile, dict[str, zipfile.ZipInfo], str, dict[str, tuple[str, str]]]:
    """Open the wheel and verify it as read_wheel does (policy, one dist-info, every member against RECORD, CRC),
    streaming: returns (zip, {path: info}, dist_info, RECORD rows)."""
    name = WheelName.parse(path.name)
    where = path.name
    try:
        zf = zipfile.ZipFile(path)
        infos = {i.filename: i for i in zf.infolist()}
        files = check_members(((i.filename, zip_kind(i)) for i in zf.infolist()), where=where)
        rels = [str(rel) for _n, rel in files]
        dist_info = _find_dist_info(name, rels, where)
        check_wheel_layout(rels, dist_info=dist_info, where=where, policy=policy)
        members = {str(rel): infos[member] for member, rel in files}
        if f"{dist_info}/RECORD" not in members:
            raise IntegrityError(f"{where}: {dist_info} has no RECORD")
        record = parse_record(zf.read(members[f"{dist_info}/RECORD"]), where=where)
        tip = "the archive was changed after it was built: fetch it again, or rebuild it"
        for rel, info in sorted(members.items()):
            if record_exempt(rel, dist_info):
                continue
            entry = record.get(rel)
            digest, size = _stream_digest(zf, info, (entry[0].partition("=")[0] if entry else "") or "sha256")
            problem = _record_mismatch(rel, digest, size, entry)
            if problem:
                raise IntegrityError(f"{where}: {problem}", tip=tip)
        for rel in sorted(record):
            if rel not in members and not record_exempt(rel, dist_info):
                raise IntegrityError(
                    f"{where}: RECORD lists {rel!r}, which the archive does not contain", tip=tip
                )
        for required in ("METADATA", "WHEEL"):
            if f"{dist_info}/{required}" not in members:
                raise IntegrityError(f"{where}: {dist_info} lacks METADATA or WHEEL")
        wheel_text = zf.read(members[f"{dist_info}/WHEEL"]).decode("utf-8")
        declared = {
            line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")
        }
        in_name = {str(t) for t in parse_wheel_filename(path.name)[3]}
        if declared and declared != in_name and "wheel-tags" not in policy.allow:
            raise IntegrityError(
                f"{where}: WHEEL declares tags {sorted(declared)} but the file name says {sorted(in_name)}",
                tip="if the upstream release really ships it so (renamed after the build), say so in the manifest: "
                'upstream.allow-members = ["wheel-tags"] (docs/commands/apply.md)',
            )
    except zipfile.BadZipFile as exc:
        raise IntegrityError(
            f"{path} is corrupt or truncated: {exc}", tip="delete it and fetch again"
        ) from None
    except (zlib.error, EOFError) as exc:
        raise IntegrityError(f"{path} is corrupt: {exc}", tip="delete it and fetch again") from None
    return zf, members, dist_info, record


def _stream_digest(zf: zipfile.ZipFile, info: zipfile.ZipInfo, algo: str) -> tuple[str, int]:
    import base64

    h = hashlib.new(algo if algo in ("sha256", "sha384", "sha512") else "sha256")
    size = 0
    with zf.open(info) as fh:  # reading to the end checks the CRC
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return f"{h.name}={base64.urlsafe_b64encode(h.digest()).rstrip(b'=').decode('ascii')}", size


def _record_mismatch(rel: str, digest: str, size: int, entry: tuple[str, str] | None) -> str | None:
    if (
        entry is None
        or "=" not in entry[0]
        or entry[0].partition("=")[0] not in ("sha256", "sha384", "sha512")
    ):
        return record_problem(rel, b"", entry)  # the entry itself is what is wrong
    if entry[0].rstrip("=") != digest:
        return f"{rel!r} does not match its RECORD hash ({entry[0]}, the file has {digest})"
    if entry[1].strip() != str(size):
        return f"{rel!r} is {size} bytes, RECORD says {entry[1]}"
    return None


def stream_patched_wheel(
    path: Path,
    *,
    policy: MemberPolicy,
    apply: Callable[[StreamTree], None],
    version: str,
    extra: dict[str, bytes],
    out_dir: Path,
) -> Path:
    """The pinned wheel ``path``, verified, patched by ``apply`` (given the lazily read tree), with ``version`` and the
    ``extra`` dist-info files, written as a new wheel into ``out_dir``."""
    zf, members, dist_info, record = open_verified(path, policy=policy)
    with zf:
        tree = StreamTree(zf, members)
        apply(tree)
        return write_patched(
            zf,
            members,
            dist_info,
            record,
            tree,
            name=WheelName.parse(path.name),
            version=version,
            extra=extra,
            out_dir=out_dir,
        )


def write_patched(
    zf: zipfile.ZipFile,
    members: dict[str, zipfile.ZipInfo],
    dist_info: str,
    record: dict[str, tuple[str, str]],
    tree: StreamTree,
    *,
    name: WheelName,
    version: str,
    extra: dict[str, bytes],
    out_dir: Path,
    compresslevel: int = 6,
) -> Path:
    """Write the patched wheel (``tree``'s changes, the version set, ``extra`` files added to the dist-info)."""
    dist, _, old_version = dist_info[: -len(".dist-info")].rpartition("-")
    new_info = f"{dist}-{version}.dist-info"
    old_data, new_data = f"{dist}-{old_version}.data", f"{dist}-{version}.data"
    final: dict[str, _Member] = {}
    for rel, info in members.items():
        if rel in tree.changed or rel == f"{dist_info}/RECORD":
            continue
        top, _sep, rest = rel.partition("/")
        target = rel
        if top == dist_info:
            target = f"{new_info}/{rest}"
        elif top == old_data:
            target = f"{new_data}/{rest}"
        digest, size = record[rel]
        final[target] = _Member(rel, info, None, tree.is_executable(rel), digest, int(size))
    for rel, data in tree.changed.items():
        if data is not None:
            final[rel] = _Member(rel, None, data, tree.is_executable(rel), record_hash(data), len(data))
    meta = f"{new_info}/METADATA"
    old_meta = zf.read(members[f"{dist_info}/METADATA"])
    new_meta = _rewrite_version(old_meta, str(name.version), version)
    final[meta] = _Member(meta, None, new_meta, False, record_hash(new_meta), len(new_meta))
    for fname, data in extra.items():
        path = f"{new_info}/{fname}"
        final[path] = _Member(path, None, data, False, record_hash(data), len(data))
    record_path = f"{new_info}/RECORD"
    order = member_order([p for p in final if p != record_path], new_info)
    rows = "".join(_csv_row(p, final[p].record, str(final[p].size)) for p in order[:-1]) + _csv_row(
        record_path, "", ""
    )
    data = rows.encode("utf-8")
    final[record_path] = _Member(record_path, None, data, False, "", len(data))
    out_name = WheelName(
        distribution=name.distribution, version=Version(version), build=name.build, tags=name.tags
    ).filename()
    tmp = out_dir / f".{out_name}.part"
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as out, open(zf.filename or "", "rb") as src:
        _write_zip(out, src, [(p, final[p]) for p in order], compresslevel)
    dest = out_dir / out_name
    publish_file(tmp, dest)
    return dest


def _csv_row(*fields: str) -> str:
    import csv
    import io

    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    return buf.getvalue()


def _write_zip(out: BinaryIO, src: BinaryIO, members: list[tuple[str, _Member]], level: int) -> None:
    y, mo, d, h, mi, s = zip_date_time()
    dos_time, dos_date = (h << 11) | (mi << 5) | (s // 2), ((y - 1980) << 9) | (mo << 5) | d
    central: list[bytes] = []
    for path, m in members:
        name = path.encode("utf-8")
        flags = 0x800 if not path.isascii() else 0
        if m.data is None:
            assert m.info is not None
            method, crc, usize = m.info.compress_type, m.info.CRC, m.info.file_size
            if m.info.flag_bits & 0x1 or method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise IntegrityError(
                    f"{m.name}: encrypted or compressed with method {method}; cannot be copied"
                )
            payload = None
            csize = m.info.compress_size
        else:
            method, crc, usize = zipfile.ZIP_DEFLATED, zlib.crc32(m.data), len(m.data)
            co = zlib.compressobj(level, zlib.DEFLATED, -15)
            payload = co.compress(m.data) + co.flush()
            csize = len(payload)
        offset = out.tell()
        if offset > 0xFFFFFFFF or csize > 0xFFFFFFFF or usize > 0xFFFFFFFF:
            raise IntegrityError(
                f"{path}: the patched wheel would need zip64, which the streaming writer does not do"
            )
        out.write(
            _LOCAL.pack(b"PK\x03\x04", 20, flags, method, dos_time, dos_date, crc, csize, usize, len(name), 0)
        )
        out.write(name)
        if payload is None:
            assert m.info is not None
            _copy_raw(src, m.info, out)
        else:
            out.write(payload)
        mode = (stat.S_IFREG | (0o755 if m.executable else 0o644)) << 16
        central.append(
            _CENTRAL.pack(
                b"PK\x01\x02",
                (3 << 8) | 20,
                20,
                flags,
                method,
                dos_time,
                dos_date,
                crc,
                csize,
                usize,
                len(name),
                0,
                0,
                0,
                0,
                mode,
                offset,
            )
            + name
        )
    start = out.tell()
    for entry in central:
        out.write(entry)
    size = out.tell() - start
    out.write(_END.pack(b"PK\x05\x06", 0, 0, len(central), len(central), size, start, 0))


def _copy_raw(src: BinaryIO, info: zipfile.ZipInfo, out: BinaryIO) -> None:
    """Copy the member's compressed bytes, as stored in the source archive, in chunks."""
    src.seek(info.header_offset)
    header = src.read(_LOCAL.size)
    sig, *_rest, name_len, extra_len = _LOCAL.unpack(header)
    if sig != b"PK\x03\x04":
        raise IntegrityError(f"{info.filename}: bad local header in the source archive")
    src.seek(info.header_offset + _LOCAL.size + name_len + extra_len)
    left = info.compress_size
    while left:
        chunk = src.read(min(left, _CHUNK))
        if not chunk:
            raise IntegrityError(f"{info.filename}: the source archive is truncated")
        out.write(chunk)
        left -= len(chunk)
