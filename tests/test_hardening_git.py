"""Hardening, issue 11 class 4: the tool's git is hermetic. The caller's repository variables, a hostile global
config and non-ASCII file names are built for real (repositories, environment variables, config files) in tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from overlay.errors import UsageError
from overlay.git import ops as gitops
from rebase_support import PKG, add_patches, make_rebase_world, make_release
from support import GIT_ENV, TRAILERS, Cli, World, git, make_wheel

REPO_VARS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
)


def _plain_git(repo: Path, *args: str) -> str:
    """git with none of the variables a test exported (so it looks at ``repo`` itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], env={**env, **GIT_ENV}, capture_output=True, check=True
    )
    return proc.stdout.decode().strip()


def _git_dir_snapshot(git_dir: Path) -> dict[str, str]:
    """Every file of a .git folder that says where the repository stands: HEAD, refs, packed-refs, index, config."""
    out = {}
    for p in sorted(git_dir.rglob("*")):
        rel = p.relative_to(git_dir).as_posix()
        if p.is_file() and (
            rel in ("HEAD", "index", "packed-refs", "config", "ORIG_HEAD")
            or rel.startswith(("refs/", "logs/"))
        ):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def decoy(tmp_path: Path) -> Path:
    """A separate, real repository the caller's GIT_* variables point at; nothing may change in it."""
    repo = tmp_path / "decoy"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "mine.txt").write_text("the user's own work\n")
    git(repo, "add", "mine.txt")
    git(repo, "commit", "-q", "-m", "user commit")
    (repo / "staged.txt").write_text("staged, not committed\n")
    git(repo, "add", "staged.txt")
    return repo


def _export_decoy(monkeypatch: pytest.MonkeyPatch, decoy: Path) -> None:
    monkeypatch.setenv("GIT_DIR", str(decoy / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(decoy))
    monkeypatch.setenv("GIT_INDEX_FILE", str(decoy / ".git" / "index"))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(decoy / ".git" / "objects"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", "/")
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'user.name'='decoy' 'core.hooksPath'='/nonexistent'")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "commit.gpgsign")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "true")


def test_scrubbed_env_keeps_only_network_and_trace_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in REPO_VARS:
        monkeypatch.setenv(name, str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
    monkeypatch.setenv("GIT_SSH_COMMAND", "ssh -i key")
    monkeypatch.setenv("GIT_TRACE2_EVENT", "/dev/null")
    env = gitops.scrubbed_env()
    assert not [k for k in (*REPO_VARS, "GIT_CONFIG_KEY_0") if k in env]
    assert env["GIT_SSH_COMMAND"] == "ssh -i key" and env["GIT_TRACE2_EVENT"] == "/dev/null"
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["LC_ALL"] == "C"


def test_checkout_and_rebase_never_touch_the_callers_repository(
    tmp_path: Path, decoy: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["util", "clean"])
    release = make_release(world)
    before = _git_dir_snapshot(decoy / ".git")
    objects_before = sorted(p.name for p in (decoy / ".git" / "objects").rglob("*"))
    _export_decoy(monkeypatch, decoy)
    root = ["--root", str(world.root)]
    r = cli(*root, "checkout", "demo")
    assert r.code == 0, r.err
    wt = Path(r.out.strip().splitlines()[-1])
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 0, r.err
    assert "published" in r.out
    for name in [k for k in os.environ if k.startswith("GIT_")]:
        monkeypatch.delenv(name)
    assert _git_dir_snapshot(decoy / ".git") == before
    assert sorted(p.name for p in (decoy / ".git" / "objects").rglob("*")) == objects_before
    assert _plain_git(decoy, "log", "--format=%s") == "user commit"
    assert _plain_git(decoy, "diff", "--cached", "--name-only") == "staged.txt"
    # the overlay worktree got its commits
    log = _plain_git(wt, "log", "--format=%s", "--reverse").splitlines()
    assert log == [
        "base: demo 1.2.0",
        "util: double by addition",
        "engine: clean_target adds the other way round",
    ]
    assert (world.series_dir / "series").read_text().startswith("# base: demo 1.3.0")


def test_a_hostile_global_config_runs_no_hook_or_fsmonitor(
    world2: World, cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "hook.sh"
    script.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\n')
    script.chmod(0o755)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for name in ("pre-commit", "post-commit", "post-checkout", "reference-transaction"):
        (hooks / name).symlink_to(script)
    config = tmp_path / "gitconfig"
    config.write_text(f"[core]\n\tfsmonitor = {script}\n\thooksPath = {hooks}\n[commit]\n\tgpgsign = true\n")
    # the config is really hostile: plain git with it runs the hook
    probe = tmp_path / "probe"
    probe.mkdir()
    env = {**os.environ, **GIT_ENV, "GIT_CONFIG_GLOBAL": str(config)}
    subprocess.run(["git", "init", "-q", str(probe)], env=env, check=True)
    subprocess.run(
        ["git", "-C", str(probe), "-c", "commit.gpgsign=false", "commit", "-q", "--allow-empty", "-m", "x"],
        env=env,
        check=True,
    )
    assert marker.is_file()
    marker.unlink()
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    r = cli("--root", str(world2.root), "checkout", "demo")
    assert r.code == 0, r.err
    assert not marker.exists(), marker.read_text()
    wt = Path(r.out.strip().splitlines()[-1])
    (wt / "python" / "demo_pkg" / "util.py").write_text("def double(x):\n    return x * 2\n")
    r = cli("--root", str(world2.root), "checkout", "demo")  # looks at the worktree (status) before refusing
    assert r.code == 2 and "uncommitted changes" in r.err
    assert not marker.exists(), marker.read_text()


def test_run_needs_an_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="without the folder"):
        gitops.run(["status"], cwd=None)
    with pytest.raises(UsageError, match="not an existing folder"):
        gitops.run(["status"], cwd=tmp_path / "gone")


def test_path_lists_are_read_nul_separated(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    gitops.init(repo)
    (repo / "módulo.py").write_text("x = 1\n")
    (repo / "a b.txt").write_text("spaces\n")
    (repo / "old name.txt").write_text("to be renamed\n" * 20)
    gitops.commit_all(repo, "base")
    (repo / "módulo.py").write_text("x = 2\n")
    (repo / "new\nline.txt").write_text("a newline in the name\n")
    gitops.run(["mv", "old name.txt", "renamed ü.txt"], cwd=repo)
    dirty = gitops.status_paths(repo)
    assert sorted(dirty) == sorted(["módulo.py", "new\nline.txt", "renamed ü.txt", "old name.txt"])
    assert gitops.z_paths(["ls-files", "-z"], cwd=repo) == ["a b.txt", "módulo.py", "renamed ü.txt"]
    with pytest.raises(UsageError, match="-z"):
        gitops.z_paths(["ls-files"], cwd=repo)
    gitops.commit_all(repo, "next")
    rows = gitops.diff_numstat(repo, "HEAD~1", "HEAD")
    assert (1, 1, "módulo.py", "módulo.py") in rows
    assert (0, 0, "old name.txt", "renamed ü.txt") in rows


def test_check_url_refuses_option_like_urls() -> None:
    for bad in ("-u/bin/sh", "--upload-pack=touch x", "", "a\nb"):
        with pytest.raises(UsageError):
            gitops.check_url(bad)
    assert gitops.check_url("./-fork") == "./-fork"


# ------------------------------------------------------------------ a conflict in a non-ASCII file name

MODULE = "módulo.py"


def _non_ascii_world(tmp_path: Path) -> World:
    world = make_rebase_world(tmp_path)
    pkg = world.upstream / "python" / "demo_pkg"
    (pkg / MODULE).write_text("def f(x):\n    y = x + 10\n    return y\n")
    git(world.upstream, "add", "-A")
    git(world.upstream, "commit", "-q", "-m", "release 1.2.0 (a module with a non-ASCII name)")
    world.base_commit = git(world.upstream, "rev-parse", "HEAD")
    git(world.upstream, "tag", "-f", "v1.2.0")
    make_wheel(world.wheel, {f"demo_pkg/{p.name}": p.read_bytes() for p in sorted(pkg.iterdir())})
    world.write_manifest()
    world.commit_change(PKG + MODULE, "y = x + 10", "y = x + 12", "módulo: f adds twelve", trailers=TRAILERS)
    world.export_series()
    return world


def test_continue_refuses_markers_left_in_a_non_ascii_file(tmp_path: Path, cli: Cli) -> None:
    world = _non_ascii_world(tmp_path)
    with zipfile.ZipFile(
        world.wheel
    ) as zf:  # 1.2.0's files (the helper's `git ls-tree` would quote the name)
        files = {n: zf.read(n) for n in zf.namelist() if not n.startswith("demo_engine-")}
    files[f"demo_pkg/{MODULE}"] = b"def f(x):\n    y = x + 11\n    return y\n"
    release = make_release(world, files=files)
    root = ["--root", str(world.root)]
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3, r.err
    report = json.loads((world.root / "build" / "reports" / "demo-rebase.json").read_text())
    assert report["stopped"]["paths"] == [PKG + MODULE]  # the real name, not git's quoted "m\303\263dulo.py"
    repo = world.root / "build" / "rebase" / "demo" / "repo"
    conflicted = repo / PKG / MODULE
    assert "<<<<<<< " in conflicted.read_text()
    r = cli(*root, "rebase", "demo", "--continue")
    assert r.code == 3, r.err
    assert re.search(re.escape(PKG + MODULE) + r":\d+", r.err), r.err
    assert "1.2.0" in (world.root / "overlays" / "demo.toml").read_text()  # nothing published
    # resolved, it goes on and publishes
    conflicted.write_text("def f(x):\n    y = x + 11 + 1\n    return y\n")
    r = cli(*root, "rebase", "demo", "--continue")
    assert r.code == 0, r.err
    assert (world.series_dir / "series").read_text().startswith("# base: demo 1.3.0")
