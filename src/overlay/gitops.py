"""The only module that runs git. Thin, typed wrappers over the git command line."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from overlay.errors import ExternalCommandError, UsageError

# A fixed identity and dates for commits the tool makes itself (base trees), so their ids are reproducible.
TOOL_IDENTITY = {
    "GIT_AUTHOR_NAME": "overlay",
    "GIT_AUTHOR_EMAIL": "overlay@localhost",
    "GIT_COMMITTER_NAME": "overlay",
    "GIT_COMMITTER_EMAIL": "overlay@localhost",
    "GIT_AUTHOR_DATE": "1980-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "1980-01-01T00:00:00Z",
}


def git_available() -> bool:
    return shutil.which("git") is not None


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GIT_TERMINAL_PROMPT", "0")
    env["LC_ALL"] = "C"
    # never let a user's global config (hooks, signing, autocrlf) change what we produce
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env.setdefault("GIT_CONFIG_GLOBAL", os.devnull)
    if extra:
        env.update(extra)
    return env


def run(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    if not git_available():
        raise UsageError("git is not installed", tip="install git (e.g. `apt-get install git`)")
    cmd = ["git", "-c", "core.autocrlf=false", "-c", "core.quotepath=true", "-c", "commit.gpgsign=false", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=_env(env), input=input, capture_output=True)
    if check and proc.returncode != 0:
        raise ExternalCommandError(
            f"`git {' '.join(args)}` failed (exit {proc.returncode}) in {cwd}: "
            f"{proc.stderr.decode('utf-8', 'replace').strip()[-2000:]}"
        )
    return proc


def out(args: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    return run(args, cwd=cwd, env=env).stdout.decode("utf-8", "replace").strip()


def init(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    run(["init", "-q", "-b", "main", str(path)])
    run(["config", "core.autocrlf", "false"], cwd=path)


def commit_all(path: Path, message: str, *, env: dict[str, str] | None = None, allow_empty: bool = False) -> str:
    """Commit everything; the identity comes from ``env`` (default: the tool's fixed identity)."""
    env = {**TOOL_IDENTITY, **(env or {})}
    run(["add", "-A", "-f", "."], cwd=path)
    args = ["commit", "-q", "--no-verify", "-m", message]
    if allow_empty:
        args.append("--allow-empty")
    run(args, cwd=path, env=env)
    return out(["rev-parse", "HEAD"], cwd=path)


def rev_parse(path: Path, rev: str) -> str | None:
    proc = run(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=path, check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def is_dirty(path: Path) -> list[str]:
    """Paths with uncommitted changes (tracked or untracked, not ignored)."""
    text = run(["status", "--porcelain=v1", "--untracked-files=all"], cwd=path).stdout.decode("utf-8", "replace")
    return [line[3:] for line in text.splitlines() if line.strip()]


def clone_or_update_mirror(url: str, mirror: Path, commit: str) -> None:
    """Keep a bare mirror of ``url`` holding ``commit`` (fetching only when it is missing)."""
    if not (mirror / "HEAD").exists():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        tmp = mirror.with_name(mirror.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        run(["clone", "--quiet", "--mirror", url, str(tmp)])
        os.replace(tmp, mirror)
    if rev_parse(mirror, commit) is None:
        run(["fetch", "--quiet", url, "+refs/*:refs/*"], cwd=mirror, check=False)
        if rev_parse(mirror, commit) is None:
            run(["fetch", "--quiet", url, commit], cwd=mirror, check=False)
    if rev_parse(mirror, commit) is None:
        raise UsageError(
            f"commit {commit} is not in {url}",
            tip="check upstream.commit in the manifest, or pass --commit",
        )


def checkout_tree(mirror: Path, commit: str, dest: Path) -> None:
    """A clean work tree of ``commit`` at ``dest`` (a clone sharing the mirror's objects)."""
    run(["clone", "--quiet", "--shared", "--no-checkout", str(mirror), str(dest)])
    run(["checkout", "--quiet", "--detach", commit], cwd=dest)
