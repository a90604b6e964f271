"""The only module that runs git. Thin, typed wrappers over the git command line, hermetic by construction.

Every call:

- runs ``git -C <dir>`` on a folder that must exist (a missing one is an error, never "wherever we are");
- sees none of the caller's repository variables: every ``GIT_*`` variable is dropped except the ones that only say
  how to reach a remote or how to trace git (:data:`KEPT_ENV`), so an exported ``GIT_DIR``, ``GIT_WORK_TREE``,
  ``GIT_INDEX_FILE``, ``GIT_OBJECT_DIRECTORY``, ``GIT_CONFIG_PARAMETERS`` ... can neither redirect our commits into
  the user's repository nor change what we produce;
- reads no system config and, unless the user exported ``GIT_CONFIG_GLOBAL`` on purpose (a proxy, ``insteadOf``
  rules for a fork), no global config; whatever config is read, :data:`FORCED_CONFIG` wins over it (no hooks, no
  fsmonitor, no ``ext::`` transport, no signing, no line-ending conversion);
- passes ``--`` before URLs and paths it hands to git, and a URL beginning with ``-`` is refused (:func:`check_url`).

Path lists are always read NUL-separated (``-z``) and decoded with ``surrogateescape``, so a non-ASCII or non-UTF-8
file name comes back as the name the file system has (:func:`z_paths`).
"""

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

# The caller's GIT_* variables that survive: how to reach a remote (ssh, proxies, TLS, credentials prompts), where
# git's own helpers live, and tracing. Nothing here names a repository, an index, an object store or config values.
KEPT_ENV = frozenset(
    {
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_SSH_VARIANT",
        "GIT_PROXY_COMMAND",
        "GIT_ASKPASS",
        "GIT_TERMINAL_PROMPT",
        "GIT_SSL_CAINFO",
        "GIT_SSL_CAPATH",
        "GIT_SSL_NO_VERIFY",
        "GIT_HTTP_USER_AGENT",
        "GIT_HTTP_LOW_SPEED_LIMIT",
        "GIT_HTTP_LOW_SPEED_TIME",
        "GIT_CURL_VERBOSE",
        "GIT_EXEC_PATH",
        "GIT_CONFIG_GLOBAL",  # an explicit choice of the user (network settings); FORCED_CONFIG still wins over it
    }
)
_KEPT_PREFIXES = ("GIT_TRACE",)

# Config the tool sets on every call; `-c` wins over every config file (system, global, the repository's own).
FORCED_CONFIG = (
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.quotepath=true",
    "core.fsmonitor=false",
    f"core.hooksPath={os.devnull}",
    "commit.gpgsign=false",
    "tag.gpgsign=false",
    "protocol.ext.allow=never",
    f"core.attributesFile={os.devnull}",
    "color.ui=never",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "log.showSignature=false",
    "gc.auto=0",
    "maintenance.auto=false",
)


def git_available() -> bool:
    return shutil.which("git") is not None


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment git runs with: the caller's, minus every GIT_* variable not in :data:`KEPT_ENV`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GIT_") or k in KEPT_ENV or k.startswith(_KEPT_PREFIXES)
    }
    env.setdefault("GIT_TERMINAL_PROMPT", "0")
    env["LC_ALL"] = "C"
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env.setdefault("GIT_CONFIG_GLOBAL", os.devnull)
    env["GIT_EDITOR"] = ":"  # nothing the tool runs may wait for an editor
    env["GIT_PAGER"] = "cat"
    if extra:
        env.update(extra)
    return env


def _folder(cwd: Path | None, args: Sequence[str]) -> Path:
    if cwd is None:
        raise UsageError(f"internal: `git {' '.join(args[:2])}` was called without the folder to run in")
    folder = Path(cwd)
    if not folder.is_absolute():
        try:
            folder = folder.absolute()
        except FileNotFoundError:
            raise UsageError(
                f"the current folder no longer exists, and git was to run in {cwd} relative to it",
                tip="cd to an existing folder (or pass --root DIR) and run the command again",
            ) from None
    if not folder.is_dir():
        raise UsageError(
            f"git was to run in {folder}, which is not an existing folder",
            tip="create it (e.g. `overlay checkout ENGINE`) or name the right one",
        )
    return folder


def run(
    args: Sequence[str],
    *,
    cwd: Path | None,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """``git -C cwd <FORCED_CONFIG> args`` with the scrubbed environment; ``cwd`` must be an existing folder."""
    if not git_available():
        raise UsageError("git is not installed", tip="install git (e.g. `apt-get install git`)")
    folder = _folder(cwd, args)
    config = [part for item in FORCED_CONFIG for part in ("-c", item)]
    cmd = ["git", "-C", str(folder), *config, *args]
    proc = subprocess.run(cmd, cwd=folder, env=scrubbed_env(env), input=input, capture_output=True)
    if check and proc.returncode != 0:
        raise ExternalCommandError(
            f"`git {' '.join(args)}` failed (exit {proc.returncode}) in {folder}: "
            f"{proc.stderr.decode('utf-8', 'replace').strip()[-2000:]}"
        )
    return proc


def out(args: Sequence[str], *, cwd: Path | None, env: dict[str, str] | None = None) -> str:
    return run(args, cwd=cwd, env=env).stdout.decode("utf-8", "replace").strip()


def z_split(raw: bytes) -> list[str]:
    """NUL-separated git output (``-z``) as file names, byte-exact (``surrogateescape`` for non-UTF-8 bytes)."""
    return [part.decode("utf-8", "surrogateescape") for part in raw.split(b"\0") if part]


def z_paths(args: Sequence[str], *, cwd: Path | None) -> list[str]:
    """The path list a ``-z`` command prints (``diff --name-only -z``, ``ls-files -z``, ``ls-tree --name-only -z``)."""
    if "-z" not in args:
        raise UsageError(f"internal: `git {' '.join(args)}` must read its path list with -z")
    return z_split(run(args, cwd=cwd).stdout)


def check_url(url: str, *, what: str = "git URL") -> str:
    """Refuse a URL or path git could take for an option (``-u...``, ``--upload-pack=...``), or an empty one."""
    if not url or url.startswith("-") or "\0" in url or "\n" in url:
        raise UsageError(
            f"{what} {url!r} is empty, begins with '-' or holds a control character; refusing to hand it to git",
            tip="name a repository URL (https://..., ssh://...) or a path (./fork for one beginning with '-')",
        )
    return url


def init(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    run(["init", "-q", "--template=", "-b", "main"], cwd=path)  # no template: no hooks copied from anywhere
    run(["config", "core.autocrlf", "false"], cwd=path)


def commit_all(
    path: Path, message: str, *, env: dict[str, str] | None = None, allow_empty: bool = False
) -> str:
    """Commit everything; the identity comes from ``env`` (default: the tool's fixed identity)."""
    env = {**TOOL_IDENTITY, **(env or {})}
    run(["add", "-A", "-f", "--", "."], cwd=path)
    args = ["commit", "-q", "--no-verify", "-m", message]
    if allow_empty:
        args.append("--allow-empty")
    run(args, cwd=path, env=env)
    return out(["rev-parse", "HEAD"], cwd=path)


def rev_parse(path: Path, rev: str) -> str | None:
    proc = run(
        ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], cwd=path, check=False
    )
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def status_paths(path: Path, *, optional_locks: bool = True) -> list[str]:
    """Paths with uncommitted changes (tracked or untracked, not ignored), from ``status --porcelain -z``.

    A rename or copy names both its paths. ``optional_locks=False`` looks without refreshing the index (the work
    tree stays byte-identical).
    """
    args = [] if optional_locks else ["--no-optional-locks"]
    raw = run([*args, "status", "--porcelain=v1", "-z", "--untracked-files=all"], cwd=path).stdout
    fields = raw.split(b"\0")
    paths: list[str] = []
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.append(entry[3:].decode("utf-8", "surrogateescape"))
        if entry[:1] in (b"R", b"C") or entry[1:2] in (b"R", b"C"):
            if i < len(fields) and fields[i]:
                paths.append(fields[i].decode("utf-8", "surrogateescape"))
            i += 1
    return paths


def clone_or_update_mirror(url: str, mirror: Path, commit: str) -> None:
    """Keep a bare mirror of ``url`` holding ``commit`` (fetching only when it is missing)."""
    check_url(url)
    if not (mirror / "HEAD").exists():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        tmp = mirror.with_name(mirror.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        run(["clone", "--quiet", "--mirror", "--", url, str(tmp)], cwd=mirror.parent)
        os.replace(tmp, mirror)
    if rev_parse(mirror, commit) is None:
        run(["fetch", "--quiet", "--", url, "+refs/*:refs/*"], cwd=mirror, check=False)
        if rev_parse(mirror, commit) is None:
            run(["fetch", "--quiet", "--", url, commit], cwd=mirror, check=False)
    if rev_parse(mirror, commit) is None:
        raise UsageError(
            f"commit {commit} is not in {url}", tip="check upstream.commit in the manifest, or pass --commit"
        )


def checkout_tree(mirror: Path, commit: str, dest: Path) -> None:
    """A clean work tree of ``commit`` at ``dest`` (a clone sharing the mirror's objects)."""
    resolved = rev_parse(mirror, commit)
    if resolved is None:
        raise UsageError(
            f"commit {commit!r} is not in {mirror}", tip="check upstream.commit in the manifest, or --commit"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    run(["clone", "--quiet", "--shared", "--no-checkout", "--", str(mirror), str(dest)], cwd=dest.parent)
    run(["checkout", "--quiet", "--detach", resolved], cwd=dest)


def diff_numstat(path: Path, old: str, new: str) -> list[tuple[int, int, str, str]]:
    """``(added, deleted, old_path, new_path)`` per changed text file between two commits (renames detected, ``-z``).

    Binary files (``-``/``-`` counts) are left out.
    """
    raw = run(["diff", "--numstat", "-z", "-M", old, new, "--"], cwd=path).stdout
    fields = raw.split(b"\0")
    rows: list[tuple[int, int, str, str]] = []
    i = 0
    while i < len(fields):
        head = fields[i]
        i += 1
        parts = head.split(b"\t", 2)
        if len(parts) != 3:
            continue
        if parts[2]:
            old_path = new_path = parts[2].decode("utf-8", "surrogateescape")
        else:  # a rename: the two paths follow as their own fields
            if i + 1 >= len(fields):
                break
            old_path = fields[i].decode("utf-8", "surrogateescape")
            new_path = fields[i + 1].decode("utf-8", "surrogateescape")
            i += 2
        if parts[0].isdigit() and parts[1].isdigit():
            rows.append((int(parts[0]), int(parts[1]), old_path, new_path))
    return rows
