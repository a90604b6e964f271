"""Files written like any tool writes them (issue 11, class 5): new files honour the umask, a rewritten file keeps its
mode, and results land on another file system (a tmpfs --out) by a temp name in the destination folder."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from overlay import fsutil
from rebase_support import add_patches, make_rebase_world, make_release
from support import GIT_ENV, TRAILERS, Cli, World


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


@pytest.fixture
def other_fs(tmp_path: Path) -> Iterator[Path]:
    """A fresh folder on another file system than tmp_path (/dev/shm, a tmpfs), removed afterwards."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    if shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("/dev/shm is on the same file system as tmp_path")
    folder = shm / f"overlay-test-{uuid.uuid4().hex}"
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_current_umask_reads_without_changing_it(umask: int) -> None:
    assert fsutil.current_umask() == umask
    assert fsutil.current_umask() == umask


def test_wheel_and_build_state_honour_the_umask(world2: World, cli: Cli, umask: int) -> None:
    r = cli("--root", str(world2.root), "-q", "apply", "demo")
    assert r.code == 0, r.err
    wheel = Path(r.out.strip())
    assert mode(wheel) == 0o666 & ~umask
    assert mode(world2.root / "build" / "state" / "demo.json") == 0o666 & ~umask
    # a rebuilt wheel keeps the mode its file has
    wheel.chmod(0o640)
    assert cli("--root", str(world2.root), "-q", "apply", "demo").code == 0
    assert mode(wheel) == 0o640


def test_refresh_keeps_modes_and_gives_new_patches_the_umask(world2: World, cli: Cli, umask: int) -> None:
    root = ["--root", str(world2.root)]
    wt = Path(cli(*root, "-q", "checkout", "demo").out.strip())
    first = sorted(world2.series_dir.glob("*.patch"))[0]
    first.chmod(0o644)
    (world2.series_dir / "series").chmod(0o640)
    env = {**os.environ, **GIT_ENV}
    core = wt / "python/demo_pkg/core.py"
    core.write_text(core.read_text().replace('prefix = "hi"', 'prefix = "hey"'))
    subprocess.run(["git", "commit", "-qam", "fixup! core: shorter greeting"], cwd=wt, env=env, check=True)
    subprocess.run(
        ["git", "rebase", "-q", "-i", "--autosquash", "overlay/base"],
        cwd=wt,
        env={**env, "GIT_SEQUENCE_EDITOR": "true"},
        check=True,
    )
    (wt / "python/demo_pkg/extra.py").write_text("def triple(x):\n    return 3 * x\n")
    subprocess.run(["git", "add", "-A"], cwd=wt, env=env, check=True)
    subprocess.run(
        ["git", "commit", "-qm", "util: add triple\n\nAdds triple.\n\n" + TRAILERS],
        cwd=wt,
        env=env,
        check=True,
    )
    r = cli(*root, "refresh", "demo")
    assert r.code == 0, r.err
    assert f"wrote {first.name}" in r.out
    assert mode(first) == 0o644  # rewritten, mode kept (even under umask 077)
    assert mode(world2.series_dir / "series") == 0o640
    assert mode(world2.series_dir / "0003-util-add-triple.patch") == 0o666 & ~umask


def test_rebase_report_and_manifest_modes(tmp_path: Path, cli: Cli, umask: int) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["clean"])
    release = make_release(world)
    manifest = world.root / "overlays" / "demo.toml"
    manifest.chmod(0o644)
    (world.series_dir / "series").chmod(0o664)
    r = cli("--root", str(world.root), "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 0, r.err
    assert 'version = "1.3.0"' in manifest.read_text()
    assert mode(manifest) == 0o644
    assert mode(world.series_dir / "series") == 0o664
    assert mode(world.root / "build" / "reports" / "demo-rebase.json") == 0o666 & ~umask


def test_a_rewritten_executable_stays_executable(tmp_path: Path, umask: int) -> None:
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    fsutil.atomic_write_bytes(tool, b"#!/bin/sh\necho new\n")
    assert mode(tool) == 0o755 and tool.read_bytes().endswith(b"echo new\n")
    made = tmp_path / "made"
    made.write_bytes(b"x")
    fsutil.publish_file(made, tool)
    assert mode(tool) == 0o755 and tool.read_bytes() == b"x" and not made.exists()
    fresh = tmp_path / "fresh.txt"
    fsutil.atomic_write_bytes(fresh, b"y")
    assert mode(fresh) == 0o666 & ~umask
    assert fsutil.new_file_mode(tmp_path / "none", executable=True) == 0o777 & ~umask
    assert not list(tmp_path.glob(".*.tmp"))


def test_publish_file_across_devices_goes_through_the_destination_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "scratch" / "demo.whl"
    src.parent.mkdir()
    src.write_bytes(b"PK wheel bytes")
    src.chmod(0o644)
    dest_dir = tmp_path / "out"
    dest_dir.mkdir()
    real = os.replace
    seen: list[tuple[str, str]] = []

    def replace(a: object, b: object) -> None:
        seen.append((str(a), str(b)))
        if Path(str(a)).parent != Path(str(b)).parent:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    fsutil.publish_file(src, dest_dir / "demo.whl")
    monkeypatch.undo()
    assert (dest_dir / "demo.whl").read_bytes() == b"PK wheel bytes" and mode(dest_dir / "demo.whl") == 0o644
    assert not src.exists() and sorted(p.name for p in dest_dir.iterdir()) == ["demo.whl"]
    # the final rename came from a temp name in the destination folder
    assert Path(seen[-1][0]).parent == dest_dir and Path(seen[-1][0]).name.startswith(".demo.whl.")


def test_apply_out_on_another_file_system(world2: World, cli: Cli, other_fs: Path) -> None:
    r = cli("--root", str(world2.root), "-q", "apply", "demo", "--out", str(other_fs))
    assert r.code == 0, r.err
    wheel = Path(r.out.strip())
    assert wheel.parent == other_fs and wheel.is_file()
    assert mode(wheel) == 0o666 & ~fsutil.current_umask()
    assert [p.name for p in other_fs.iterdir()] == [wheel.name]  # no temp file beside it
    assert not list((world2.root / "build" / "tmp").iterdir())


def test_checkout_and_refresh_with_a_worktree_on_another_file_system(
    world2: World, cli: Cli, other_fs: Path
) -> None:
    root = ["--root", str(world2.root)]
    wt = other_fs / "wt"
    r = cli(*root, "-q", "checkout", "demo", "--worktree", str(wt))
    assert r.code == 0, r.err
    assert (wt / ".git" / "overlay-checkout.json").is_file()
    core = wt / "python/demo_pkg/core.py"
    core.write_text(core.read_text().replace('prefix = "hi"', 'prefix = "hey"'))
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "commit", "-qam", "fixup! core: shorter greeting"], cwd=wt, env=env, check=True)
    subprocess.run(
        ["git", "rebase", "-q", "-i", "--autosquash", "overlay/base"],
        cwd=wt,
        env={**env, "GIT_SEQUENCE_EDITOR": "true"},
        check=True,
    )
    r = cli(*root, "refresh", "demo", "--worktree", str(wt))
    assert r.code == 0, r.err
    r = cli(*root, "refresh", "demo", "--worktree", str(wt))
    assert r.code == 0 and "nothing to do" in r.out, r.err
    assert not list((wt / ".git").glob(".overlay-checkout.json.*"))
