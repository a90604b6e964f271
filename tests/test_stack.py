from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from overlay.errors import UsageError
from overlay.stack.checkout import checkout
from overlay.stack.refresh import refresh
from support import GIT_ENV, Cli, World, git


def snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def wt_git(wt: Path, *args: str) -> str:
    return git(wt, *args)


def test_checkout_makes_base_plus_one_commit_per_patch(world2: World, cli: Cli) -> None:
    r = cli("--root", str(world2.root), "checkout", "demo")
    assert r.code == 0, r.err
    wt = Path(r.out.strip())
    log = wt_git(wt, "log", "--format=%s", "--reverse").splitlines()
    assert log == ["base: demo 1.2.0", "core: shorter greeting", "util: double by addition"]
    body = wt_git(wt, "log", "-1", "--format=%B", "HEAD~1")
    assert "Overlay-Numerics: exact" in body and "Upstream-Status: Pending" in body
    assert (
        wt_git(wt, "log", "-1", "--format=%an <%ae> %aI", "HEAD")
        == "Test Author <author@example.com> 2026-01-02T03:04:05+00:00"
    )
    assert (wt / "python/demo_pkg/core.py").read_text().count('prefix = "hi"') == 1
    # the base commit is reproducible
    other = checkout(root=world2.root, engine="demo", worktree=world2.root / "build" / "wt2")
    assert other.base == wt_git(wt, "rev-parse", "overlay/base")


def test_refresh_of_an_unchanged_worktree_rewrites_no_byte(world2: World, cli: Cli) -> None:
    before = snapshot(world2.series_dir)
    mtimes = {p.name: p.stat().st_mtime_ns for p in world2.series_dir.iterdir()}
    assert cli("--root", str(world2.root), "-q", "checkout", "demo").code == 0
    r = cli("--root", str(world2.root), "refresh", "demo")
    assert r.code == 0 and "nothing to do" in r.out
    assert snapshot(world2.series_dir) == before
    assert {p.name: p.stat().st_mtime_ns for p in world2.series_dir.iterdir()} == mtimes


def test_edit_reorder_and_new_commit(world2: World, cli: Cli) -> None:
    wt = Path(cli("--root", str(world2.root), "-q", "checkout", "demo").out.strip())
    names = sorted(p.name for p in world2.series_dir.glob("*.patch"))
    old = {n: (world2.series_dir / n).read_bytes() for n in names}
    # amend the first patch (via a fixup + autosquash), keep its message and trailers
    core = wt / "python/demo_pkg/core.py"
    core.write_text(core.read_text().replace('prefix = "hi"', 'prefix = "hey"'))
    env = {**os.environ, **GIT_ENV, "GIT_SEQUENCE_EDITOR": "true"}
    import subprocess

    subprocess.run(["git", "commit", "-qam", "fixup! core: shorter greeting"], cwd=wt, env=env, check=True)
    subprocess.run(["git", "rebase", "-q", "-i", "--autosquash", "overlay/base"], cwd=wt, env=env, check=True)
    r = cli("--root", str(world2.root), "refresh", "demo")
    assert r.code == 0, r.err
    assert f"wrote {names[0]}" in r.out and names[1] not in r.out
    new0 = (world2.series_dir / names[0]).read_bytes()
    assert b'+    prefix = "hey"' in new0 and b"Overlay-Numerics: exact" in new0
    assert (world2.series_dir / names[1]).read_bytes() == old[names[1]]
    # a new commit without trailers: refresh writes it, lint refuses it and names the fix
    (wt / "python/demo_pkg/extra.py").write_text("def triple(x):\n    return 3 * x\n")
    subprocess.run(["git", "add", "-A"], cwd=wt, env=env, check=True)
    subprocess.run(["git", "commit", "-qm", "util: add triple"], cwd=wt, env=env, check=True)
    assert cli("--root", str(world2.root), "-q", "refresh", "demo").code == 0
    assert (world2.series_dir / "series").read_text().splitlines()[-1] == "0003-util-add-triple.patch"
    lint = cli("--root", str(world2.root), "lint", "demo")
    assert lint.code == 2
    assert "0003-util-add-triple.patch: missing trailer Overlay-Theme:" in lint.err
    assert "TIP add the four trailers" in lint.err
    # reorder: the two later commits swap; both files are renumbered, the series follows
    subprocess.run(
        ["git", "rebase", "-q", "-i", "overlay/base"],
        cwd=wt,
        env={**env, "GIT_SEQUENCE_EDITOR": "sed -i '2{h;d};3{G}'"},
        check=True,
    )
    assert cli("--root", str(world2.root), "-q", "refresh", "demo").code == 0
    series = (world2.series_dir / "series").read_text().splitlines()[1:]
    assert series == [names[0], "0002-util-add-triple.patch", "0003-util-double-by-addition.patch"]
    assert sorted(p.name for p in world2.series_dir.glob("*.patch")) == series


def test_refresh_refuses_dirty_worktree_and_foreign_base(world2: World, cli: Cli) -> None:
    wt = Path(cli("--root", str(world2.root), "-q", "checkout", "demo").out.strip())
    (wt / "python/demo_pkg/util.py").write_text("dirty\n")
    r = cli("--root", str(world2.root), "refresh", "demo")
    assert r.code == 2 and "has uncommitted changes" in r.err and "--force" in r.err
    wt_git(wt, "checkout", "-q", "--", ".")
    # a history that does not start at the pinned base
    wt_git(wt, "checkout", "-q", "--orphan", "other")
    wt_git(wt, "commit", "-q", "-m", "unrelated root")
    r = cli("--root", str(world2.root), "refresh", "demo")
    assert r.code == 2 and "does not descend from the pinned base" in r.err and "--force" in r.err


def test_checkout_refuses_to_clobber(world2: World) -> None:
    checkout(root=world2.root, engine="demo")
    with pytest.raises(UsageError, match="already exists.*"):
        checkout(root=world2.root, engine="demo")
    checkout(root=world2.root, engine="demo", force=True)


def test_checkout_upto_keeps_the_rest_on_refresh(world2: World) -> None:
    before = snapshot(world2.series_dir)
    res = checkout(root=world2.root, engine="demo", upto=1)
    assert len(res.commits) == 1
    out = refresh(root=world2.root, engine="demo")
    assert out.written == () and snapshot(world2.series_dir) == before
