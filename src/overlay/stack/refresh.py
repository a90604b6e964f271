"""`overlay refresh`: the checkout worktree's commits written back to ``patches/ENGINE``, all or nothing.

A commit that is still the one checkout made keeps its patch file byte for byte; anything else is exported with
``git format-patch`` (:data:`overlay.stack.checkout.FORMAT_PATCH_ARGS`). The files are published through the
transaction in :mod:`overlay.stack.transaction`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlay.core.inputs import read_inside
from overlay.core.manifest import Manifest, load_engine
from overlay.core.series import load_engine_series, parse_patch_bytes
from overlay.errors import ConfigError, UsageError
from overlay.fsutil import owned_scratch, sha256_bytes
from overlay.git import ops as gitops
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter
from overlay.stack.checkout import _state_path, base_tree_files, default_worktree, export_patches, read_state
from overlay.stack.locks import engine_lock
from overlay.stack.transaction import publish_changes, recover_refresh, refresh_txn_dir


@dataclass(frozen=True)
class RefreshResult:
    written: tuple[str, ...]  # patch files whose bytes changed or are new
    kept: tuple[str, ...]  # patch files left byte-identical (possibly renamed)
    removed: tuple[str, ...]
    series_changed: bool
    warnings: tuple[
        str, ...
    ] = ()  # Overlay-Requires that the new order or a removed patch broke (lint refuses them)


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
        return _refresh(
            root=root, engine=engine, worktree=worktree, force=force, dry_run=True, reporter=reporter
        )
    with engine_lock(root, engine, command=f"overlay refresh {engine}", wait=wait, reporter=reporter):
        recover_refresh(root, engine, reporter=reporter)
        return _refresh(
            root=root, engine=engine, worktree=worktree, force=force, dry_run=False, reporter=reporter
        )


def _refresh(
    *, root: Path, engine: str, worktree: Path | None, force: bool, dry_run: bool, reporter: Reporter | None
) -> RefreshResult:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    worktree = (worktree or default_worktree(root, engine)).resolve()
    if not (worktree / ".git").is_dir():
        raise UsageError(f"{worktree} is not a git worktree", tip=f"run `overlay checkout {engine}` first")
    state = read_state(worktree, engine=engine)
    if state.get("engine") != engine:
        raise UsageError(f"{worktree} is a checkout of {state.get('engine')!r}, not {engine!r}")
    dirty = gitops.status_paths(worktree)
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
        raise UsageError(
            f"{worktree}: merge commits cannot become patches ({merges[0][:12]})",
            tip="linearise with git rebase",
        )
    with owned_scratch(layout(root).tmp, f"refresh-{engine}") as scratch:
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
            parse_patch_bytes(
                data, name=name, where=f"commit {commit[:12]}"
            )  # refuse what we could not read back
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
        new_state["rest"] = [n for n, _d, _k in new_files[len(commits) :]] if state.get("rest") else []
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
    reporter.step(
        "git",
        f"refresh: {len(written)} written, {len(removed)} removed, series {'changed' if series_text != old_text else 'unchanged'}",
    )
    from overlay.core.lint import requires_warnings

    warnings = requires_warnings([parse_patch_bytes(d, name=n) for n, d, _k in new_files])
    return RefreshResult(
        written=written, kept=kept, removed=removed, series_changed=series_text != old_text, warnings=warnings
    )


def _base_problems(worktree: Path, base: str, state: dict[str, Any], manifest: Manifest) -> str:
    if state.get("upstream") != manifest.upstream.version:
        return (
            f"{worktree} was checked out at {manifest.name} {state.get('upstream')}, but the manifest now pins "
            f"{manifest.upstream.version}"
        )
    if gitops.rev_parse(worktree, base) is None:
        return f"{worktree}: the base commit {base[:12]} is gone"
    roots = gitops.out(["rev-list", "--max-parents=0", "HEAD"], cwd=worktree).split()
    if roots != [base]:
        return f"{worktree}: HEAD does not descend from the pinned base commit {base[:12]} alone (roots: {[r[:12] for r in roots]})"
    return ""


def _base_tree_problem(root: Path, worktree: Path, base: str, manifest: Manifest) -> str:
    """The base commit must hold exactly the pinned artifact's tree (the pin may have changed at the same version)."""
    from overlay.git.objects import tree_id

    expected = tree_id(base_tree_files(root, manifest))
    found = gitops.out(["rev-parse", f"{base}^{{tree}}"], cwd=worktree)
    if found != expected:
        return (
            f"{worktree}: the base commit {base[:12]} does not hold the pinned artifact's tree "
            f"({manifest.upstream.primary.filename}, sha256 {manifest.upstream.primary.sha256[:16]}...): "
            f"tree {found[:12]}, expected {expected[:12]}"
        )
    return ""


def _series_text(path: Path, manifest: Manifest, names: list[str]) -> str:
    """Rewrite the series file's entries, keeping its header and every comment and blank line with its entry
    (:func:`overlay.core.series.render_series`, the writer ``rebase`` uses too)."""
    from overlay.core.series import render_series

    old = path.read_text(encoding="utf-8")
    header = (
        old.splitlines()[0]
        if old.strip()
        else f"# base: {manifest.name} {manifest.upstream.version} {manifest.upstream.commit or '-'}"
    )
    return render_series(old, header=header, names=names)
