"""The series as a git worktree: `overlay checkout` (one commit per patch); `overlay refresh` (:mod:`overlay.stack.refresh`) writes it back.

The worktree's first commit is the pinned upstream tree laid out at git-repository-root paths (the wheel's files
under ``package-root``), committed with a fixed identity and date so its id is reproducible. Each patch becomes one
commit with the patch's author, date and message (trailers included). ``refresh`` writes the series back: a commit
that is still the one checkout made keeps its patch file byte for byte; anything else is exported with
``git format-patch --no-signature --zero-commit --full-index --no-numbered``.
"""

from __future__ import annotations

import email.utils
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlay.core.archive_policy import check_member_name
from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import Manifest, check_engine_name, load_engine
from overlay.core.patching import DirTree, apply_patch
from overlay.core.series import Patch, load_engine_series
from overlay.core.sources import member_policy
from overlay.core.wheels import read_wheel, repo_layout_files
from overlay.errors import ConfigError, UsageError
from overlay.fsutil import atomic_write_text, owned_scratch, publish_dir, read_json_state
from overlay.git import ops as gitops
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter
from overlay.stack.locks import engine_lock
from overlay.stack.transaction import recover_refresh

STATE_FILE = "overlay-checkout.json"
FORMAT_PATCH_ARGS = (
    "format-patch",
    "--no-signature",
    "--zero-commit",
    "--full-index",
    "--no-numbered",
    "--no-cover-letter",
    "--no-thread",
    "--no-attach",
    "--subject-prefix=PATCH",
    "--no-binary",
)


@dataclass(frozen=True)
class CheckoutResult:
    worktree: Path
    base: str
    commits: tuple[tuple[str, str], ...]  # (commit, patch name)


def default_worktree(root: Path, engine: str) -> Path:
    return layout(root).worktrees / check_engine_name(engine)


def _state_path(worktree: Path) -> Path:
    return worktree / ".git" / STATE_FILE


def read_state(worktree: Path, *, engine: str | None = None) -> dict[str, Any]:
    """The checkout state of ``worktree``; a missing one is a UsageError, a corrupt one a ConfigError naming its path."""
    path = _state_path(worktree)
    if not path.is_file():
        raise UsageError(
            f"{worktree} is not a worktree made by `overlay checkout` (no .git/{STATE_FILE})",
            tip="run `overlay checkout ENGINE` first",
        )
    name = engine or "ENGINE"
    tip = (
        f"`overlay checkout {name} --force` makes the worktree again from patches/{name} (its commits that refresh "
        "has not written back are lost: save them with `git format-patch` first)"
    )
    data = read_json_state(path, what="checkout state", tip=tip)
    problem = _checkout_state_problem(data)
    if problem:
        raise ConfigError(f"checkout state {path} has the wrong shape: {problem}", tip=tip)
    state: dict[str, Any] = data
    return state


def _checkout_state_problem(data: Any) -> str:
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, expected an object"
    if data.get("version") != 1:
        return f"version {data.get('version')!r}, expected 1"
    for key in ("engine", "upstream", "base"):
        if not isinstance(data.get(key), str):
            return f"{key!r} is {data.get(key)!r}, expected a string"
    if data.get("upto") is not None and not isinstance(data.get("upto"), int):
        return f"'upto' is {data.get('upto')!r}, expected a number or null"
    patches = data.get("patches")
    if not isinstance(patches, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("commit", "name", "sha256"))
        for e in patches
    ):
        return "'patches' is not a list of {commit, name, sha256} strings"
    rest = data.get("rest", [])
    if not isinstance(rest, list) or not all(isinstance(n, str) for n in rest):
        return "'rest' is not a list of patch names"
    return ""


def base_tree_files(
    root: Path, manifest: Manifest, *, offline: bool = False, reporter: Reporter | None = None
) -> dict[str, bytes]:
    """The pinned wheel's files (dist-info excluded) at git-repository-root paths."""
    artifact = manifest.upstream.primary
    if not artifact.is_wheel:
        raise UsageError(f"{manifest.name}: checkout needs a wheel pin, {artifact.filename} is an sdist")
    contents = read_wheel(
        fetch_artifact(root, manifest, artifact, offline=offline, reporter=reporter),
        policy=member_policy(manifest),
    )
    return repo_layout_files(contents, manifest.upstream.package_root)


def write_base_commit(repo: Path, files: dict[str, bytes], message: str) -> str:
    """Write the base tree and commit it. Archive content never writes repository control files: every path is
    checked (no ``.git`` component, nothing that escapes) before the first file is written."""
    for rel in files:
        check_member_name(rel, where="base tree", what="file")
    for rel, data in files.items():
        target = repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return gitops.commit_all(repo, message, env=gitops.TOOL_IDENTITY)


def commit_patch(repo: Path, patch: Patch) -> str:
    """Apply ``patch`` strictly to the work tree, stage only the paths it touches (a stray file in the work tree, e.g.
    left by a conflicted attempt, is never committed with it) and commit it with the patch's author, date and message
    (``checkout``, and ``rebase`` and ``review`` in their scratch repositories)."""
    apply_patch(DirTree(repo), patch)
    gitops.run(["add", "-A", "-f", "--", *patch.paths], cwd=repo)
    return commit_as_patch(repo, patch)


def commit_as_patch(repo: Path, patch: Patch) -> str:
    """Commit what is staged with ``patch``'s author, date and message (trailers included); returns the commit."""
    name, addr = email.utils.parseaddr(patch.author)
    env = {
        "GIT_AUTHOR_NAME": name or addr,
        "GIT_AUTHOR_EMAIL": addr,
        "GIT_AUTHOR_DATE": patch.date or gitops.TOOL_IDENTITY["GIT_AUTHOR_DATE"],
        "GIT_COMMITTER_NAME": gitops.TOOL_IDENTITY["GIT_COMMITTER_NAME"],
        "GIT_COMMITTER_EMAIL": gitops.TOOL_IDENTITY["GIT_COMMITTER_EMAIL"],
        "GIT_COMMITTER_DATE": patch.date or gitops.TOOL_IDENTITY["GIT_COMMITTER_DATE"],
    }
    message = patch.subject + ("\n\n" + patch.body if patch.body else "") + "\n"
    msg_file = repo / ".git" / "OVERLAY_MSG"
    msg_file.write_text(message, encoding="utf-8")
    gitops.run(
        ["commit", "-q", "--no-verify", "--allow-empty", "--cleanup=verbatim", "-F", str(msg_file)],
        cwd=repo,
        env=env,
    )
    msg_file.unlink()
    return gitops.out(["rev-parse", "HEAD"], cwd=repo)


def checkout(
    *,
    root: Path,
    engine: str,
    worktree: Path | None = None,
    upto: int | None = None,
    force: bool = False,
    offline: bool = False,
    wait: float = 0.0,
    reporter: Reporter | None = None,
) -> CheckoutResult:
    """Make the worktree (see the module docstring), holding the engine's lock; an interrupted refresh is rolled back
    first."""
    load_engine(root, engine)
    with engine_lock(
        root,
        engine,
        command=f"overlay checkout {engine}" + (" --force" if force else ""),
        wait=wait,
        reporter=reporter,
    ):
        recover_refresh(root, engine, reporter=reporter)
        return _checkout(
            root=root,
            engine=engine,
            worktree=worktree,
            upto=upto,
            force=force,
            offline=offline,
            reporter=reporter,
        )


def _checkout(
    *,
    root: Path,
    engine: str,
    worktree: Path | None,
    upto: int | None,
    force: bool,
    offline: bool,
    reporter: Reporter | None,
) -> CheckoutResult:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    series = load_engine_series(root, manifest)
    if upto is not None and not 0 <= upto <= len(series.patches):
        raise UsageError(f"--upto {upto} is out of range: the series has {len(series.patches)} patches")
    worktree = (worktree or default_worktree(root, engine)).resolve()
    if worktree.exists() and any(worktree.iterdir()) and not force:
        dirty = gitops.status_paths(worktree) if (worktree / ".git").is_dir() else ["(not a git repository)"]
        raise UsageError(
            f"{worktree} already exists"
            + (f" and has uncommitted changes ({len(dirty)} paths)" if dirty else ""),
            tip=f"keep working there and `overlay refresh {engine}`, or pass --force to recreate it (discards its commits)",
        )
    files = base_tree_files(root, manifest, offline=offline, reporter=reporter)
    patches = series.prefix(upto)
    with owned_scratch(layout(root).tmp, f"checkout-{engine}") as scratch:
        repo = scratch / "wt"
        gitops.init(repo)
        reporter.step("git", f"base commit: {manifest.name} {manifest.upstream.version} ({len(files)} files)")
        base = write_base_commit(repo, files, base_message(manifest))
        gitops.run(["tag", "overlay/base", base], cwd=repo)
        commits: list[tuple[str, str]] = []
        for i, patch in enumerate(patches, start=1):
            reporter.step("apply", f"[{i}/{len(patches)}] {patch.name}")
            commits.append((commit_patch(repo, patch), patch.name))
        state = {
            "version": 1,
            "engine": engine,
            "upstream": manifest.upstream.version,
            "base": base,
            "upto": upto,
            "patches": [{"commit": c, "name": n, "sha256": p.sha256} for (c, n), p in zip(commits, patches)],
            "rest": [p.name for p in series.patches[len(patches) :]],
        }
        atomic_write_text(_state_path(repo), json.dumps(state, indent=2) + "\n")
        # the old worktree (--force) is moved aside, not deleted, until the new one is in place
        aside = worktree.with_name(f".{worktree.name}.old-{os.getpid()}") if worktree.exists() else None
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(worktree, aside)
        try:
            publish_dir(repo, worktree)  # --worktree may be on another file system
        except BaseException:
            if aside is not None and not worktree.exists():
                os.replace(aside, worktree)
            raise
        if aside is not None:
            shutil.rmtree(aside)
    reporter.step("git", f"worktree ready: {worktree} ({len(commits)} patch commits on overlay/base)")
    return CheckoutResult(worktree=worktree, base=base, commits=tuple(commits))


def base_message(manifest: Manifest) -> str:
    a = manifest.upstream.primary
    return f"base: {manifest.name} {manifest.upstream.version}\n\n{a.filename}\nsha256 {a.sha256}\n"


def export_patches(repo: Path, base: str, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    gitops.run([*FORMAT_PATCH_ARGS, "-o", str(out), f"{base}..HEAD"], cwd=repo)
    return sorted(out.glob("*.patch"))


# ------------------------------------------------------------------ the refresh transaction
