"""The streaming apply writes the same wheel contents as the in-memory path (every member, its mode, RECORD),
copies unchanged members' compressed bytes as they are, and refuses what the in-memory reader refuses."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from overlay.core.build import apply_engine
from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import load_engine
from overlay.core.patching import apply_series
from overlay.core.provenance import PROVENANCE_FILE, build_provenance, dumps, local_version
from overlay.core.series import load_engine_series
from overlay.core.sources import member_policy
from overlay.core.wheels import read_wheel, set_version, write_wheel
from overlay.errors import IntegrityError
from support import World

REPO = Path(__file__).resolve().parents[2]


def in_memory(root: Path, engine: str, out: Path) -> Path:
    """The path apply took before: every member unpacked, patched, every member recompressed."""
    manifest = load_engine(root, engine)
    artifact = manifest.upstream.primary
    patches = load_engine_series(root, manifest).patches
    contents = read_wheel(fetch_artifact(root, manifest, artifact), policy=member_policy(manifest))
    apply_series(contents.tree, patches, package_root=manifest.upstream.package_root)
    contents = set_version(contents, local_version(manifest, patches, root=root))
    prov = build_provenance(
        manifest,
        patches,
        artifact=artifact,
        source={"kind": "artifact", "filename": artifact.filename},
        root=root,
    )
    contents.tree.write(f"{contents.dist_info}/{PROVENANCE_FILE}", dumps(prov))
    return write_wheel(contents, out)


def members(wheel: Path) -> dict[str, tuple[bytes, int]]:
    with zipfile.ZipFile(wheel) as zf:
        assert zf.testzip() is None
        return {i.filename: (zf.read(i), i.external_attr >> 16) for i in zf.infolist()}


def same_as_in_memory(root: Path, engine: str, tmp_path: Path) -> tuple[Path, Path]:
    streamed = apply_engine(root=root, engine=engine, out_dir=tmp_path / "stream", artifact_name=None).wheel
    before = in_memory(root, engine, tmp_path / "memory")
    assert streamed.name == before.name
    a, b = members(streamed), members(before)
    assert list(a) == list(b)  # same order: sorted, dist-info last, RECORD last
    assert a == b
    return streamed, before


def test_demo_wheel_same_contents_and_unchanged_members_copied(world2: World, tmp_path: Path) -> None:
    streamed, _ = same_as_in_memory(world2.root, "demo", tmp_path)
    with zipfile.ZipFile(world2.wheel) as up, zipfile.ZipFile(streamed) as new:
        native = "demo_pkg/native.so"
        assert new.getinfo(native).compress_size == up.getinfo(native).compress_size
        assert new.getinfo(native).CRC == up.getinfo(native).CRC
    again = apply_engine(root=world2.root, engine="demo", out_dir=tmp_path / "again").wheel
    assert again.read_bytes() == streamed.read_bytes()


def test_a_member_changed_inside_the_archive_is_refused(world2: World, tmp_path: Path) -> None:
    raw = bytearray(world2.wheel.read_bytes())
    with zipfile.ZipFile(world2.wheel) as zf:
        info = zf.getinfo("demo_pkg/util.py")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    raw[start + 2] ^= 0xFF  # one compressed byte flipped: the CRC (or inflate) fails while streaming
    world2.wheel.write_bytes(bytes(raw))
    world2.write_manifest()
    shutil.rmtree(world2.root / "build" / "cache", ignore_errors=True)
    with pytest.raises(IntegrityError, match="corrupt"):
        apply_engine(root=world2.root, engine="demo", out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").iterdir())


@pytest.mark.network
def test_real_mlx_lm_same_contents_as_the_in_memory_path(tmp_path: Path) -> None:
    same_as_in_memory(REPO, "mlx-lm", tmp_path)
