from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import pytest

from overlay.core.wheels import read_wheel, set_version, write_wheel
from overlay.errors import IntegrityError
from support import make_wheel

FILES = {"demo_pkg/__init__.py": b"X = 1\n", "demo_pkg/native.so": bytes(range(256))}


def test_roundtrip_regenerates_record_and_is_reproducible(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "demo_engine-1.2.0-py3-none-any.whl", FILES, executable=frozenset({"demo_pkg/native.so"})
    )
    contents = set_version(read_wheel(wheel), "1.2.0+ovl.0.gdeadbeef")
    a = write_wheel(contents, tmp_path / "a")
    b = write_wheel(set_version(read_wheel(wheel), "1.2.0+ovl.0.gdeadbeef"), tmp_path / "b")
    assert a.name == "demo_engine-1.2.0+ovl.0.gdeadbeef-py3-none-any.whl"
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        names = zf.namelist()
        assert names[-1] == "demo_engine-1.2.0+ovl.0.gdeadbeef.dist-info/RECORD"
        assert zf.read("demo_pkg/native.so") == FILES["demo_pkg/native.so"]
        assert (zf.getinfo("demo_pkg/native.so").external_attr >> 16) & stat.S_IXUSR
        meta = zf.read("demo_engine-1.2.0+ovl.0.gdeadbeef.dist-info/METADATA").decode()
        assert "Version: 1.2.0+ovl.0.gdeadbeef\n" in meta
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    again = read_wheel(a)  # RECORD is consistent with the members
    record = again.tree.files[f"{again.dist_info}/RECORD"].decode().splitlines()
    assert len(record) == len(again.tree.files)


def test_source_date_epoch_sets_timestamps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = make_wheel(tmp_path / "demo_engine-1.2.0-py3-none-any.whl", FILES)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    out = write_wheel(read_wheel(wheel), tmp_path / "o")
    with zipfile.ZipFile(out) as zf:
        assert zf.infolist()[0].date_time == (2023, 11, 14, 22, 13, 20)


def _member(name: str, mode: int = 0o644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = mode << 16
    return info


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_member("../evil.py"), r"contains '\.\.'"),
        (_member("/etc/evil.py"), "is absolute"),
        (_member("demo_pkg/link", stat.S_IFLNK | 0o777), "is a symlink"),
        (_member("demo_pkg/__init__.py"), "appears twice"),
    ],
)
def test_unsafe_members_are_refused(tmp_path: Path, member: zipfile.ZipInfo, message: str) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        wheel = make_wheel(
            tmp_path / "demo_engine-1.2.0-py3-none-any.whl", FILES, extra_members=[(member, b"x")]
        )
    with pytest.raises(IntegrityError, match=message):
        read_wheel(wheel)


def test_truncated_and_corrupt_archives(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "demo_engine-1.2.0-py3-none-any.whl", FILES)
    data = wheel.read_bytes()
    wheel.write_bytes(data[: len(data) // 2])
    with pytest.raises(IntegrityError, match="corrupt or truncated"):
        read_wheel(wheel)
    flipped = bytearray(data)
    pos = data.index(b"PK\x03\x04") + 60  # inside the first member's compressed data
    flipped[pos] ^= 0xFF
    wheel.write_bytes(bytes(flipped))
    with pytest.raises(IntegrityError):
        read_wheel(wheel)


def test_tags_must_match_file_name(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "demo_engine-1.2.0-py3-none-any.whl", FILES, tag="cp311-cp311-linux_x86_64")
    with pytest.raises(IntegrityError, match="WHEEL declares tags"):
        read_wheel(wheel)
