"""Transactions, locks and recoverable state (issue 11, class 6): refresh publishes all or nothing, one lock per
engine, scratch folders owned from the moment they exist, corrupt state files reported with their path and
recoverable."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from overlay import fsutil
from overlay.errors import ConfigError, UsageError
from overlay.stack.locks import lock_path
from overlay.stack.refresh import refresh
from overlay.stack.transaction import recover_refresh, refresh_txn_dir
from rebase_support import PKG, add_patches, make_rebase_world, make_release
from support import GIT_ENV, TRAILERS, Cli, World

REPO_SRC = Path(__file__).resolve().parents[1] / "src"


def overlay_proc(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A second, real `overlay` process (python -m overlay) on the test world."""
    env = {**os.environ, **GIT_ENV, "PYTHONPATH": str(REPO_SRC)}
    return subprocess.run(
        [sys.executable, "-m", "overlay", "--root", str(root), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` (hidden ones included, so a stray temp file shows)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def wt_commit(wt: Path, *args: str) -> None:
    subprocess.run(
        ["git", *args],
        cwd=wt,
        env={**os.environ, **GIT_ENV, "GIT_SEQUENCE_EDITOR": "true"},
        check=True,
        capture_output=True,
    )


def edit_worktree(wt: Path) -> None:
    """Change every kind of thing refresh publishes: rewrite 0001, drop 0002, add a new 0002, so series changes."""
    wt_commit(wt, "reset", "-q", "--hard", "HEAD~1")
    core = wt / "python/demo_pkg/core.py"
    core.write_text(core.read_text().replace('prefix = "hi"', 'prefix = "hey"'))
    wt_commit(wt, "commit", "-q", "-a", "--amend", "--no-edit")
    (wt / "python/demo_pkg/extra.py").write_text("def triple(x):\n    return 3 * x\n")
    wt_commit(wt, "add", "-A")
    wt_commit(wt, "commit", "-q", "-m", "util: add triple\n\nAdds triple.\n\n" + TRAILERS)


# ------------------------------------------------------------------ refresh: all or nothing


def test_refresh_publishes_all_or_nothing_at_every_step(
    world2: World, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = world2.root
    wt = Path(cli("--root", str(root), "-q", "checkout", "demo").out.strip())
    edit_worktree(wt)
    state_file = wt / ".git" / "overlay-checkout.json"

    def snap() -> tuple[dict[str, bytes], bytes, list[str]]:
        leftovers = (
            [p.name for p in (root / "build" / "tmp").iterdir()] if (root / "build" / "tmp").is_dir() else []
        )
        strays = [p.name for p in (wt / ".git").glob(".overlay-checkout.json.*")]
        return folder_bytes(world2.series_dir), state_file.read_bytes(), leftovers + strays

    old = snap()
    real_replace = os.replace
    calls: list[int] = []

    def failing_at(k: int, *, kill: bool) -> Callable[..., None]:
        def replace(src: object, dst: object) -> None:
            calls.append(1)
            n = len(calls)
            if n == k or (kill and n > k):
                raise OSError(5, f"injected failure at os.replace call {n}")
            real_replace(src, dst)  # type: ignore[arg-type]

        return replace

    probe = refresh(root=root, engine="demo", dry_run=True)
    assert probe.written and probe.removed and probe.series_changed
    steps: list[str] = []
    published = False
    for k in range(1, 100):
        for kill in (False, True):
            calls.clear()
            monkeypatch.setattr(os, "replace", failing_at(k, kill=kill))
            failure = ""
            try:
                refresh(root=root, engine="demo")
                published = True
            except OSError as exc:
                failure = str(exc)
            assert published or "injected failure" in failure
            monkeypatch.undo()
            if published:
                break
            if (
                kill
            ):  # a "killed" run (every later rename fails too, the undo included): the next run rolls it back
                assert (refresh_txn_dir(root, "demo") / "journal.json").is_file() or snap() == old
                recover_refresh(root, "demo")
            # a failure the process survives is undone at once
            assert snap() == old, (
                f"step {k} (kill={kill}): patches/ or the checkout state is neither old nor new"
            )
            assert not refresh_txn_dir(root, "demo").exists()
            steps.append(f"{k}{'k' if kill else ''}")
        if published:
            break
    assert published and k > 6, f"only {k - 1} renames before the refresh succeeded: {steps}"
    new = snap()
    assert new[0] != old[0] and new[2] == []
    assert "0002-util-double-by-addition.patch" not in new[0] and "0002-util-add-triple.patch" in new[0]
    assert not [n for n in new[0] if n.startswith(".")]
    assert (world2.series_dir / "series").read_text().splitlines()[1:] == sorted(
        n for n in new[0] if n != "series"
    )
    assert not refresh_txn_dir(root, "demo").exists()
    # the state moved with the series: a second refresh has nothing to do
    r = cli("--root", str(root), "refresh", "demo")
    assert r.code == 0 and "nothing to do" in r.out, r.err


def test_a_killed_refresh_is_rolled_back_by_the_next_run(
    world2: World, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = world2.root
    wt = Path(cli("--root", str(root), "-q", "checkout", "demo").out.strip())
    edit_worktree(wt)
    before = folder_bytes(world2.series_dir)
    real_replace = os.replace
    seen: list[str] = []

    def replace(src: object, dst: object) -> None:
        seen.append(str(dst))
        if len([d for d in seen if "/patches/demo/" in d]) >= 2:  # a kill after the first patch file went in
            raise KeyboardInterrupt
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(
        "overlay.stack.transaction.rollback_changes", lambda *a, **k: (_ for _ in ()).throw(OSError("killed"))
    )
    r = cli("--root", str(root), "refresh", "demo")
    monkeypatch.undo()
    assert r.code == 130
    assert "either as it was or fully updated" in r.err and "TIP run the command again" in r.err
    assert folder_bytes(world2.series_dir) != before  # half published: the journal is still there
    assert (refresh_txn_dir(root, "demo") / "journal.json").is_file()
    r = cli("--root", str(root), "refresh", "demo")
    assert r.code == 0, r.err
    assert "rolled back an interrupted refresh of demo" in r.err
    after = folder_bytes(world2.series_dir)
    assert "0002-util-add-triple.patch" in after and not [n for n in after if n.startswith(".")]
    assert not refresh_txn_dir(root, "demo").exists()


def test_ctrl_c_in_a_refresh_leaves_the_old_series(
    world2: World, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = world2.root
    wt = Path(cli("--root", str(root), "-q", "checkout", "demo").out.strip())
    edit_worktree(wt)
    before = folder_bytes(world2.series_dir)
    real_replace = os.replace
    n = [0]

    def replace(src: object, dst: object) -> None:
        n[0] += 1
        if n[0] == 7:
            raise KeyboardInterrupt
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    r = cli("--root", str(root), "refresh", "demo")
    monkeypatch.undo()
    assert r.code == 130
    assert folder_bytes(world2.series_dir) == before
    assert not refresh_txn_dir(root, "demo").exists()


# ------------------------------------------------------------------ one lock per engine


def test_a_second_run_is_refused_naming_the_lock_holder(world2: World, cli: Cli) -> None:
    root = world2.root
    assert cli("--root", str(root), "-q", "checkout", "demo").code == 0
    with fsutil.exclusive_lock(lock_path(root, "demo"), command="overlay rebase demo --to 9.9"):
        for args in (("checkout", "demo", "--force"), ("refresh", "demo")):
            proc = overlay_proc(root, *args)
            assert proc.returncode == 2, proc.stderr
            assert f"another overlay run holds {lock_path(root, 'demo')}" in proc.stderr
            assert f"pid {os.getpid()} (`overlay rebase demo --to 9.9`, since " in proc.stderr
            assert "TIP" in proc.stderr and "--wait SECONDS" in proc.stderr
        with pytest.raises(UsageError, match=r"another overlay run holds .*pid \d+"):
            refresh(root=root, engine="demo")
        # a dry run writes nothing and takes no lock
        assert refresh(root=root, engine="demo", dry_run=True).written == ()
    # released: the lock file is emptied, and the next run goes
    assert lock_path(root, "demo").read_bytes() == b""
    assert cli("--root", str(root), "-q", "checkout", "demo", "--force").code == 0


HELD_MIDWAY = """
import sys, time
from pathlib import Path
import overlay.stack.checkout as stack
go = Path(sys.argv[1])
real = stack.write_base_commit
def held(*args, **kwargs):
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return real(*args, **kwargs)
stack.write_base_commit = held
from overlay.cli.main import main
raise SystemExit(main(sys.argv[2:]))
"""


def test_two_concurrent_checkout_force_runs(world2: World, cli: Cli, tmp_path: Path) -> None:
    root = world2.root
    assert cli("--root", str(root), "-q", "checkout", "demo").code == 0
    go = tmp_path / "go"
    env = {**os.environ, **GIT_ENV, "PYTHONPATH": str(REPO_SRC)}
    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HELD_MIDWAY,
            str(go),
            "--root",
            str(root),
            "-q",
            "checkout",
            "demo",
            "--force",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while (
            fsutil.read_lock_holder(lock_path(root, "demo")).pid != first.pid
        ):  # the first run holds it, mid-way
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = overlay_proc(root, "checkout", "demo", "--force")
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid} (`overlay checkout demo --force`, since " in second.stderr
        assert "fatal:" not in second.stderr and "unexpected" not in second.stderr
    finally:
        go.write_text("")
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert Path(out.strip()) == root / "build" / "worktrees" / "demo"
    r = cli("--root", str(root), "refresh", "demo")
    assert r.code == 0 and "nothing to do" in r.out, r.err


def test_concurrent_rebase_to_gets_the_lock_message(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["clean"])
    release = make_release(world)
    with fsutil.exclusive_lock(lock_path(world.root, "demo"), command="overlay rebase demo --to 1.3.0"):
        proc = overlay_proc(world.root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
        assert proc.returncode == 2, proc.stderr
        assert f"pid {os.getpid()} (`overlay rebase demo --to 1.3.0`" in proc.stderr
        proc = overlay_proc(world.root, "rebase", "demo", "--abort")
        assert proc.returncode == 2 and "another overlay run holds" in proc.stderr
    assert not (world.root / "build" / "rebase" / "demo").exists()


def test_wait_takes_the_lock_once_it_is_free(world2: World) -> None:
    from overlay.progress import ListReporter
    from overlay.stack.checkout import checkout

    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with fsutil.exclusive_lock(lock_path(world2.root, "demo"), command="overlay checkout demo"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    threading.Timer(0.5, release.set).start()
    rep = ListReporter()
    t0 = time.monotonic()
    result = checkout(root=world2.root, engine="demo", wait=20, reporter=rep)
    t.join()
    assert time.monotonic() - t0 >= 0.4 and len(result.commits) == 2
    assert any(line.startswith("lock:") and "waiting up to 20 s" in line for line in rep.lines)
    # waiting gives up after its time, naming how long it waited
    with (
        fsutil.exclusive_lock(lock_path(world2.root, "demo"), command="held"),
        pytest.raises(UsageError, match=r"\(waited 0.3 s\)"),
    ):
        checkout(root=world2.root, engine="demo", force=True, wait=0.3)


# ------------------------------------------------------------------ scratch folders


def test_scratch_is_owned_from_the_moment_it_exists(tmp_path: Path) -> None:
    parent = tmp_path / "tmp"
    live = fsutil.make_scratch(parent, "apply-demo")
    assert live.name.startswith(f"apply-demo-{os.getpid()}-") and not (live / ".owner").exists()
    # a concurrent cleaner right after mkdtemp (before anything is written in it) leaves it alone
    assert fsutil.clean_stale_scratch(parent) == 0 and live.is_dir()
    # another live process's folder stays; once that process is gone, it is stale
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        theirs = parent / f"checkout-mlx-lm-{other.pid}-abc123xy"
        theirs.mkdir()
        assert fsutil.clean_stale_scratch(parent) == 0 and theirs.is_dir()
    finally:
        other.kill()
        other.wait()
    dead = subprocess.Popen(["true"])
    dead.wait()
    legacy = parent / "refresh-demo-oldstyle"
    legacy.mkdir()
    (legacy / ".owner").write_text(str(dead.pid))
    (parent / "stray").mkdir()  # names no owner at all
    (parent / "a-file.lock").write_text("")  # files are not scratch folders
    assert fsutil.clean_stale_scratch(parent) == 3
    assert sorted(p.name for p in parent.iterdir()) == sorted([live.name, "a-file.lock"])
    with fsutil.owned_scratch(parent, "apply-demo") as mine:
        assert fsutil.scratch_owner(mine) == os.getpid()
    assert not mine.exists() and live.is_dir()


# ------------------------------------------------------------------ corrupt state files

CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda good: good[: len(good) // 2],
    "not-json": lambda good: b"\x89PNG\r\n\x1a\n\xff\xfe garbage",
    "wrong-shape": lambda good: b'{"version": 1, "engine": "demo", "patches": "none"}\n',
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_a_corrupt_checkout_state_is_named_and_checkout_force_recovers(
    world2: World, cli: Cli, how: str
) -> None:
    root = ["--root", str(world2.root)]
    wt = Path(cli(*root, "-q", "checkout", "demo").out.strip())
    state = wt / ".git" / "overlay-checkout.json"
    state.write_bytes(CORRUPTIONS[how](state.read_bytes()))
    r = cli(*root, "refresh", "demo")
    assert r.code == 2, r.err
    assert f"checkout state {state}" in r.err
    assert "TIP `overlay checkout demo --force` makes the worktree again" in r.err
    assert "unexpected" not in r.err
    assert cli(*root, "-q", "checkout", "demo", "--force").code == 0
    r = cli(*root, "refresh", "demo")
    assert r.code == 0 and "nothing to do" in r.out


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_a_corrupt_build_state_is_named(world2: World, cli: Cli, how: str) -> None:
    state = world2.root / "build" / "state" / "demo.json"
    state.parent.mkdir(parents=True)
    good = json.dumps(
        {
            "version": 1,
            "wheel": "/x/demo.whl",
            "wheel_version": "1.2.0+ovl.2.gabcdef12",
            "patches": 2,
            "time": 1,
        }
    ).encode()
    state.write_bytes(good)
    r = cli("--root", str(world2.root), "list")
    assert r.code == 0 and "1.2.0+ovl.2.gabcdef12" in r.out
    state.write_bytes(CORRUPTIONS[how](good))
    r = cli("--root", str(world2.root), "list")
    assert r.code == 2, r.err
    assert f"build state {state}" in r.err and "TIP `overlay apply demo` writes it again" in r.err
    assert "unexpected" not in r.err


@pytest.fixture
def stopped_rebase(tmp_path: Path, cli: Cli) -> tuple[World, dict[str, str]]:
    """A rebase stopped on a conflict, and a snapshot of patches/ and overlays/ from before it started."""
    world = make_rebase_world(tmp_path)
    add_patches(world, ["clean", "conflict"])
    release = make_release(world)
    before = {
        **{f"patches/{k}": v.hex() for k, v in folder_bytes(world.series_dir).items()},
        **{f"overlays/{k}": v.hex() for k, v in folder_bytes(world.root / "overlays").items()},
    }
    r = cli("--root", str(world.root), "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3, r.err
    return world, before


def tree(world: World) -> dict[str, str]:
    return {
        **{f"patches/{k}": v.hex() for k, v in folder_bytes(world.series_dir).items()},
        **{f"overlays/{k}": v.hex() for k, v in folder_bytes(world.root / "overlays").items()},
    }


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_a_corrupt_rebase_state_is_named_and_abort_recovers(
    stopped_rebase: tuple[World, dict[str, str]], cli: Cli, how: str
) -> None:
    world, before = stopped_rebase
    root = ["--root", str(world.root)]
    state = world.root / "build" / "rebase" / "demo" / "state.json"
    state.write_bytes(CORRUPTIONS[how](state.read_bytes()))
    for args in (("--continue",), ("--skip",), ()):
        r = cli(*root, "rebase", "demo", *args)
        assert r.code == 2, (args, r.err)
        assert (
            f"rebase state {state}" in r.err
            and "TIP `overlay rebase demo --abort` discards the rebase" in r.err
        )
        assert "unexpected" not in r.err
    r = cli(*root, "rebase", "demo", "--abort")
    assert r.code == 0, r.err
    assert not state.parent.exists() and tree(world) == before


def test_ctrl_c_while_a_rebase_publishes_puts_the_old_series_back(
    stopped_rebase: tuple[World, dict[str, str]], cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import overlay.upstream.rebase.publishing as rb

    world, before = stopped_rebase
    root = ["--root", str(world.root)]
    engine = world.root / "build" / "rebase" / "demo" / "repo" / PKG / "engine.py"
    engine.write_text(
        re.sub(
            r"<<<<<<< [^\n]*\n.*?>>>>>>> [^\n]*\n",
            "    f = x + 11 + 1\n",
            engine.read_text(),
            flags=re.DOTALL,
        )
    )
    from overlay.fsutil import atomic_write_text as real

    def interrupt_at_manifest(path: Path, text: str) -> None:
        if path.suffix == ".toml":
            raise KeyboardInterrupt  # patch files and series are in, the manifest is not
        real(path, text)

    monkeypatch.setattr(rb, "atomic_write_text", interrupt_at_manifest)
    r = cli(*root, "rebase", "demo", "--continue")
    monkeypatch.undo()
    assert r.code == 130 and "either as it was or fully updated" in r.err
    assert tree(world) == before
    state = world.root / "build" / "rebase" / "demo" / "state.json"
    assert json.loads(state.read_text())["status"] == "running"
    r = cli(*root, "rebase", "demo", "--continue")
    assert r.code == 0, r.err
    assert 'version = "1.3.0"' in (world.root / "overlays" / "demo.toml").read_text()
    assert not state.parent.exists()


def test_abort_undoes_an_interrupted_publish_even_from_a_corrupt_state(
    stopped_rebase: tuple[World, dict[str, str]], cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import overlay.upstream.rebase.publishing as rb

    world, before = stopped_rebase
    root = ["--root", str(world.root)]
    repo = world.root / "build" / "rebase" / "demo" / "repo"
    engine = repo / PKG / "engine.py"
    engine.write_text(
        re.sub(
            r"<<<<<<< [^\n]*\n.*?>>>>>>> [^\n]*\n",
            "    f = x + 11 + 1\n",
            engine.read_text(),
            flags=re.DOTALL,
        )
    )
    from overlay.fsutil import atomic_write_text as real

    def kill_at_series(path: Path, text: str) -> None:
        if path.name == "series":
            raise KeyboardInterrupt  # the patch files are in, the series is not
        real(path, text)

    monkeypatch.setattr(rb, "atomic_write_text", kill_at_series)
    monkeypatch.setattr(rb, "_restore_backup", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
    assert cli(*root, "rebase", "demo", "--continue").code == 130
    monkeypatch.undo()
    state = world.root / "build" / "rebase" / "demo" / "state.json"
    assert json.loads(state.read_text())["status"] == "publishing"
    assert tree(world) != before
    state.write_bytes(state.read_bytes()[:40])
    r = cli(*root, "rebase", "demo", "--abort")
    assert r.code == 0, r.err
    assert "the interrupted publish was undone" in r.out
    assert tree(world) == before and not state.parent.exists()


def test_a_corrupt_refresh_journal_is_named(world2: World) -> None:
    txn = refresh_txn_dir(world2.root, "demo")
    txn.mkdir(parents=True)
    (txn / "journal.json").write_bytes(b'{"version": 1, "targets": [')
    with pytest.raises(ConfigError, match=r"refresh journal .*journal.json is not valid JSON") as exc:
        recover_refresh(world2.root, "demo")
    assert exc.value.tip is not None and str(txn / "backup") in exc.value.tip
