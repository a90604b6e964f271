"""The series as a git worktree: `overlay checkout` (one commit per patch) and `overlay refresh` (worktree -> patches).

The worktree's first commit is the pinned upstream tree laid out at git-repository-root paths (the wheel's files
under ``package-root``), committed with a fixed identity and date so its id is reproducible. Each patch becomes one
commit with the patch's author, date and message (trailers included). ``refresh`` writes the series back: a commit
that is still the one checkout made keeps its patch file byte for byte; anything else is exported with
``git format-patch --no-signature --zero-commit --full-index --no-numbered``.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlay import gitops
from overlay.archive_policy import check_member_name
from overlay.build import build_dir, load_engine_series, member_policy
from overlay.errors import ConfigError, UsageError
from overlay.fetch import fetch_artifact
from overlay.fsutil import (
    LockHolder,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    exclusive_lock,
    new_file_mode,
    owned_scratch,
    publish_dir,
    publish_file,
    read_json_state,
    sha256_bytes,
)
from overlay.inputs import read_inside
from overlay.manifest import Manifest, check_engine_name, load_engine
from overlay.patching import DirTree, apply_patch
from overlay.progress import NullReporter, Reporter
from overlay.series import Patch, parse_patch_bytes
from overlay.wheels import read_wheel, repo_layout_files

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


@dataclass(frozen=True)
class RefreshResult:
    written: tuple[str, ...]  # patch files whose bytes changed or are new
    kept: tuple[str, ...]  # patch files left byte-identical (possibly renamed)
    removed: tuple[str, ...]
    series_changed: bool
    warnings: tuple[str, ...] = ()  # Overlay-Requires that the new order or a removed patch broke (lint refuses them)


def default_worktree(root: Path, engine: str) -> Path:
    return build_dir(root) / "worktrees" / check_engine_name(engine)


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
    tip = (f"`overlay checkout {name} --force` makes the worktree again from patches/{name} (its commits that refresh "
           "has not written back are lost: save them with `git format-patch` first)")
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
        isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("commit", "name", "sha256")) for e in patches
    ):
        return "'patches' is not a list of {commit, name, sha256} strings"
    rest = data.get("rest", [])
    if not isinstance(rest, list) or not all(isinstance(n, str) for n in rest):
        return "'rest' is not a list of patch names"
    return ""


def lock_path(root: Path, engine: str) -> Path:
    return build_dir(root) / "locks" / f"{engine}.lock"


def engine_lock(
    root: Path, engine: str, *, command: str, wait: float = 0.0, reporter: Reporter | None = None
) -> contextlib.AbstractContextManager[None]:
    """The one lock per engine that ``checkout``, ``refresh`` and ``rebase`` hold while they change its series, worktree
    or rebase state (``build/locks/ENGINE.lock``): a second run fails at once naming the holder, or waits ``wait`` s."""
    rep = reporter or NullReporter()

    def waiting(holder: LockHolder) -> None:
        rep.step("lock", f"{engine} is locked by {holder.describe()}; waiting up to {wait:g} s")

    return exclusive_lock(lock_path(root, engine), command=command, wait=wait, on_wait=waiting)


def base_tree_files(root: Path, manifest: Manifest, *, offline: bool = False, reporter: Reporter | None = None) -> dict[str, bytes]:
    """The pinned wheel's files (dist-info excluded) at git-repository-root paths."""
    artifact = manifest.upstream.primary
    if not artifact.is_wheel:
        raise UsageError(f"{manifest.name}: checkout needs a wheel pin, {artifact.filename} is an sdist")
    contents = read_wheel(fetch_artifact(root, manifest, artifact, offline=offline, reporter=reporter),
                          policy=member_policy(manifest))
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
    """Apply ``patch`` strictly to the work tree and commit it with the patch's own author, date and message."""
    apply_patch(DirTree(repo), patch)
    gitops.run(["add", "-A", "-f", "--", "."], cwd=repo)
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
    gitops.run(["commit", "-q", "--no-verify", "--allow-empty", "--cleanup=verbatim", "-F", str(msg_file)], cwd=repo, env=env)
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
    with engine_lock(root, engine, command=f"overlay checkout {engine}" + (" --force" if force else ""), wait=wait,
                     reporter=reporter):
        recover_refresh(root, engine, reporter=reporter)
        return _checkout(root=root, engine=engine, worktree=worktree, upto=upto, force=force, offline=offline,
                         reporter=reporter)


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
    if worktree.exists() and any(worktree.iterdir()):
        if not force:
            dirty = gitops.is_dirty(worktree) if (worktree / ".git").is_dir() else ["(not a git repository)"]
            raise UsageError(
                f"{worktree} already exists" + (f" and has uncommitted changes ({len(dirty)} paths)" if dirty else ""),
                tip=f"keep working there and `overlay refresh {engine}`, or pass --force to recreate it (discards its commits)",
            )
    files = base_tree_files(root, manifest, offline=offline, reporter=reporter)
    patches = series.prefix(upto)
    with owned_scratch(build_dir(root) / "tmp", f"checkout-{engine}") as scratch:
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
            "rest": [p.name for p in series.patches[len(patches):]],
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


def refresh(
    *,
    root: Path,
    engine: str,
    worktree: Path | None = None,
    force: bool = False,
    dry_run: bool = False,
    wait: float = 0.0,
    reporter: Reporter | None = None,
) -> RefreshResult:
    """Write the worktree's commits back to ``patches/ENGINE`` (see the module docstring), all or nothing.

    Holds the engine's lock. Every new file is written first into ``build/refresh/ENGINE/staged`` and the files it
    replaces are copied to ``build/refresh/ENGINE/backup``; a journal then records the swap, and the files are renamed
    into place, ``series`` and the worktree's checkout state last. A failure rolls the swap back at once; a killed run
    is rolled back by the next ``refresh``, ``checkout`` or ``rebase`` of the engine (:func:`recover_refresh`).
    """
    load_engine(root, engine)
    if dry_run:
        return _refresh(root=root, engine=engine, worktree=worktree, force=force, dry_run=True, reporter=reporter)
    with engine_lock(root, engine, command=f"overlay refresh {engine}", wait=wait, reporter=reporter):
        recover_refresh(root, engine, reporter=reporter)
        return _refresh(root=root, engine=engine, worktree=worktree, force=force, dry_run=False, reporter=reporter)


def _refresh(
    *, root: Path, engine: str, worktree: Path | None, force: bool, dry_run: bool, reporter: Reporter | None,
) -> RefreshResult:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    worktree = (worktree or default_worktree(root, engine)).resolve()
    if not (worktree / ".git").is_dir():
        raise UsageError(f"{worktree} is not a git worktree", tip=f"run `overlay checkout {engine}` first")
    state = read_state(worktree, engine=engine)
    if state.get("engine") != engine:
        raise UsageError(f"{worktree} is a checkout of {state.get('engine')!r}, not {engine!r}")
    dirty = gitops.is_dirty(worktree)
    if dirty and not force:
        raise UsageError(
            f"{worktree} has uncommitted changes ({', '.join(dirty[:5])}{' ...' if len(dirty) > 5 else ''})",
            tip="commit or discard them first (refresh exports commits only), or pass --force to ignore them",
        )
    base = state["base"]
    problems = _base_problems(worktree, base, state, manifest)
    if not problems and not force:
        problems = _base_tree_problem(root, worktree, base, manifest)
    if problems and not force:
        raise UsageError(problems, tip="check out the series again at the current pin, or pass --force")
    series_dir = manifest.series_dir(root)
    old_series = load_engine_series(root, manifest, check_folder=False)
    known = {p["commit"]: p["name"] for p in state["patches"]}
    old_bytes = {p.name: p.raw for p in old_series.patches}
    commits = gitops.out(["rev-list", "--reverse", f"{base}..HEAD"], cwd=worktree).split()
    merges = gitops.out(["rev-list", "--merges", f"{base}..HEAD"], cwd=worktree).split()
    if merges:
        raise UsageError(f"{worktree}: merge commits cannot become patches ({merges[0][:12]})", tip="linearise with git rebase")
    with owned_scratch(build_dir(root) / "tmp", f"refresh-{engine}") as scratch:
        exported = export_patches(worktree, base, scratch / "out") if commits else []
        if len(exported) != len(commits):
            raise UsageError(f"git format-patch wrote {len(exported)} files for {len(commits)} commits")
        new_files: list[tuple[str, bytes, bool]] = []  # (name, bytes, kept)
        for idx, (commit, path) in enumerate(zip(commits, exported), start=1):
            data = path.read_bytes()
            slug = path.name[5:]  # strip git's own "NNNN-"
            if commit in known:
                data = old_bytes[known[commit]]
                slug = known[commit][5:]
            name = f"{idx:04d}-{slug}"
            parse_patch_bytes(data, name=name, where=f"commit {commit[:12]}")  # refuse what we could not read back
            new_files.append((name, data, commit in known))
        offset = len(new_files)
        for j, rest_name in enumerate(state.get("rest", []), start=1):
            if rest_name not in old_bytes:
                raise ConfigError(f"{rest_name} (after --upto) is no longer in the series")
            new_files.append((f"{offset + j:04d}-{rest_name[5:]}", old_bytes[rest_name], True))
    written = tuple(n for n, d, _k in new_files if old_bytes.get(n) != d)
    kept = tuple(n for n, d, _k in new_files if old_bytes.get(n) == d or (_k and n not in old_bytes))
    new_names = {n for n, _d, _k in new_files}
    removed = tuple(sorted(set(old_bytes) - new_names))
    series_text = _series_text(series_dir / "series", manifest, [n for n, _d, _k in new_files])
    old_text = read_inside(root, series_dir / "series", what="series file").decode("utf-8")
    if not dry_run:
        # the worktree now matches the series: remember its commits so a second refresh rewrites nothing
        new_state = dict(state)
        new_state["patches"] = [
            {"commit": c, "name": n, "sha256": sha256_bytes(d)} for c, (n, d, _k) in zip(commits, new_files)
        ]
        new_state["rest"] = [n for n, _d, _k in new_files[len(commits):]] if state.get("rest") else []
        new_state["upto"] = None
        changes: list[tuple[Path, bytes | None]] = []
        for name, data, _k in new_files:
            target = series_dir / name
            if not target.is_file() or target.read_bytes() != data:
                changes.append((target, data))
        changes += [(series_dir / name, None) for name in removed]
        if series_text != old_text:
            changes.append((series_dir / "series", series_text.encode("utf-8")))
        changes.append((_state_path(worktree), (json.dumps(new_state, indent=2) + "\n").encode("utf-8")))
        publish_changes(refresh_txn_dir(root, engine), engine, changes)
    reporter.step("git", f"refresh: {len(written)} written, {len(removed)} removed, series {'changed' if series_text != old_text else 'unchanged'}")
    from overlay.lint import requires_warnings

    warnings = requires_warnings([parse_patch_bytes(d, name=n) for n, d, _k in new_files])
    return RefreshResult(written=written, kept=kept, removed=removed, series_changed=series_text != old_text,
                         warnings=warnings)


# ------------------------------------------------------------------ the refresh transaction

JOURNAL = "journal.json"


def refresh_txn_dir(root: Path, engine: str) -> Path:
    return build_dir(root) / "refresh" / engine


def publish_changes(txn: Path, engine: str, changes: list[tuple[Path, bytes | None]]) -> None:
    """Put every ``(target, bytes)`` in place (``None``: remove the target), all or nothing.

    1. stage: the new bytes go to ``txn/staged`` (each with the mode its target has, or 0o666 less the umask), the
       current targets are copied to ``txn/backup``; 2. ``txn/journal.json`` records the swap (status
       ``publishing``); 3. the staged files are renamed over their targets (a temp name in the target's folder when
       ``build/`` is on another file system), in order; 4. the journal is removed, then ``txn``. A failure in 3 puts
       the backup back at once; a killed run leaves the journal, and :func:`rollback_changes` undoes it.
    """
    if txn.exists():
        shutil.rmtree(txn)
    staged, backup = txn / "staged", txn / "backup"
    entries: list[dict[str, Any]] = []
    journal_written = False
    try:
        staged.mkdir(parents=True)
        backup.mkdir()
        for i, (target, data) in enumerate(changes):
            key = f"{i:04d}-{target.name}"
            had = target.is_file()
            if had:
                shutil.copy2(target, backup / key)
            if data is not None:
                atomic_write_bytes(staged / key, data, mode=new_file_mode(target))
            entries.append({"path": str(target), "key": key, "backup": had, "remove": data is None})
        atomic_write_json(txn / JOURNAL, {"version": 1, "engine": engine, "status": "publishing", "targets": entries})
        journal_written = True
        for e in entries:
            target = Path(e["path"])
            if e["remove"]:
                target.unlink(missing_ok=True)
            else:
                publish_file(staged / e["key"], target)
        (txn / JOURNAL).unlink()
    except BaseException:
        undone = not journal_written
        if journal_written:
            with contextlib.suppress(Exception):  # when undoing fails too, the journal stays: the next run rolls back
                rollback_changes(txn, entries)
                undone = True
        if undone:
            shutil.rmtree(txn, ignore_errors=True)
        raise
    shutil.rmtree(txn, ignore_errors=True)


def rollback_changes(txn: Path, entries: list[dict[str, Any]]) -> list[str]:
    """Put back what ``txn/backup`` holds over each journal entry's target, remove the targets that were new, and remove
    the temp files a killed rename left beside them. Returns the paths it changed."""
    restored: list[str] = []
    for e in entries:
        target = Path(e["path"])
        if target.parent.is_dir():
            for stray in target.parent.glob(f".{glob_escape(target.name)}.*.tmp"):
                stray.unlink(missing_ok=True)
        if e["backup"]:
            saved = txn / "backup" / e["key"]
            data = saved.read_bytes()
            mode = new_file_mode(saved)
            if not target.is_file() or target.read_bytes() != data or new_file_mode(target) != mode:
                atomic_write_bytes(target, data, mode=mode)
                restored.append(str(target))
        elif target.is_file():
            target.unlink()
            restored.append(str(target))
    return restored


def recover_refresh(root: Path, engine: str, *, reporter: Reporter | None = None) -> tuple[str, ...]:
    """Undo a refresh of ``engine`` that was killed while publishing (its journal is still there); returns the paths
    put back. Called, under the engine's lock, by every ``refresh``, ``checkout`` and ``rebase`` of the engine."""
    txn = refresh_txn_dir(root, engine)
    if not txn.exists():
        return ()
    journal = txn / JOURNAL
    restored: list[str] = []
    if journal.is_file():
        tip = (f"the files it replaced are in {txn / 'backup'}; put back what you need by hand, then remove {txn}")
        data = read_json_state(journal, what="refresh journal", tip=tip)
        entries = data.get("targets") if isinstance(data, dict) else None
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("key"), str)
            and isinstance(e.get("backup"), bool) for e in entries
        ):
            raise ConfigError(f"refresh journal {journal} has the wrong shape (no list of targets)", tip=tip)
        restored = rollback_changes(txn, entries)
        (reporter or NullReporter()).step(
            "git", f"refresh: rolled back an interrupted refresh of {engine} ({len(restored)} files put back)")
    shutil.rmtree(txn)
    return tuple(restored)


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)


def _base_problems(worktree: Path, base: str, state: dict[str, Any], manifest: Manifest) -> str:
    if state.get("upstream") != manifest.upstream.version:
        return (f"{worktree} was checked out at {manifest.name} {state.get('upstream')}, but the manifest now pins "
                f"{manifest.upstream.version}")
    if gitops.rev_parse(worktree, base) is None:
        return f"{worktree}: the base commit {base[:12]} is gone"
    roots = gitops.out(["rev-list", "--max-parents=0", "HEAD"], cwd=worktree).split()
    if roots != [base]:
        return f"{worktree}: HEAD does not descend from the pinned base commit {base[:12]} alone (roots: {[r[:12] for r in roots]})"
    return ""


def _base_tree_problem(root: Path, worktree: Path, base: str, manifest: Manifest) -> str:
    """The base commit must hold exactly the pinned artifact's tree (the pin may have changed at the same version)."""
    from overlay.gitobjects import tree_id

    expected = tree_id(base_tree_files(root, manifest))
    found = gitops.out(["rev-parse", f"{base}^{{tree}}"], cwd=worktree)
    if found != expected:
        return (f"{worktree}: the base commit {base[:12]} does not hold the pinned artifact's tree "
                f"({manifest.upstream.primary.filename}, sha256 {manifest.upstream.primary.sha256[:16]}...): "
                f"tree {found[:12]}, expected {expected[:12]}")
    return ""


def _series_text(path: Path, manifest: Manifest, names: list[str]) -> str:
    """Rewrite the series file's entries, keeping its header and every comment and blank line with its entry
    (:func:`overlay.series.render_series`, the writer ``rebase`` uses too)."""
    from overlay.series import render_series

    old = path.read_text(encoding="utf-8")
    header = old.splitlines()[0] if old.strip() else \
        f"# base: {manifest.name} {manifest.upstream.version} {manifest.upstream.commit or '-'}"
    return render_series(old, header=header, names=names)
