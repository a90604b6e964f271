"""`overlay rebase ENGINE --to VERSION` (and ``--continue`` / ``--skip`` / ``--abort``): move a series onto a new release.

1. The new release's artifact is found through pip (the same wheel tags as the pinned one) or ``--url``, hashed and
   cached; nothing in ``overlays/`` or ``patches/`` changes yet.
2. A scratch repository under ``build/rebase/ENGINE/repo`` replays the series (see :mod:`overlay.upstream.replay`) and
   classifies every patch: clean, offset, merged, conflict, upstreamed, obsolete.
3. A ``conflict`` or ``obsolete`` patch stops the rebase (exit 3): its attempt is in the scratch repository's work
   tree; the user finishes it there and runs ``--continue`` (or ``--skip`` to drop the patch, ``--abort`` to give up,
   which leaves ``patches/``, ``overlays/`` and every worktree exactly as they were). The state lives in
   ``build/rebase/ENGINE/state.json``, so the commands work across invocations.
4. When every patch is resolved the result is published: the patch files (a patch whose diff did not change keeps its
   bytes; the others are re-exported like ``refresh`` does, renumbered by position), ``series`` with the new
   ``# base:`` line, the ``DROPPED`` ledger (upstreamed and dropped patches, with the version and the reason) and the
   manifest's pin (version, tag, artifact file names and sha256, edited in place). The old series is kept under
   ``build/rebase-history/ENGINE/A-to-B/old`` for ``overlay review``.

Every run writes ``build/reports/ENGINE-rebase.json`` (the class table, schema in docs/commands/rebase.md).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version

from overlay.core.manifest import Manifest, load_engine
from overlay.core.series import Patch, load_engine_series
from overlay.errors import ConfigError, UsageError
from overlay.fsutil import atomic_write_bytes, owned_scratch
from overlay.git import ops as gitops
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter
from overlay.stack.checkout import base_message
from overlay.stack.locks import engine_lock
from overlay.stack.transaction import recover_refresh
from overlay.upstream.outcome import Outcome
from overlay.upstream.rebase.publishing import _publish, _restore_backup
from overlay.upstream.rebase.state import (
    BACKUP_COMPLETE,
    STATE_FILE,
    AbortResult,
    RebaseResult,
    Status,
    _artifact_json,
    _check_snapshot,
    _checkout_guard,
    _load_state,
    _old_patches,
    _requires_warnings,
    _result,
    _save_state,
    _snapshot,
    _workspace,
    _write_report,
    report_path,
    state_dir,
)
from overlay.upstream.releases import check_version, manifest_at, resolve_release, wheel_tree
from overlay.upstream.replay import classify, estimate_conflicts, replay_all, resolve_stopped
from overlay.upstream.workspace import Workspace, discard_attempt, prepare

# ------------------------------------------------------------------ start


def rebase(
    *,
    root: Path,
    engine: str,
    to: str,
    url: str | None = None,
    commit: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    offline: bool = False,
    wait: float = 0.0,
    reporter: Reporter | None = None,
) -> RebaseResult:
    """Start a rebase of ``engine``'s series onto upstream ``to`` (see the module docstring), holding the engine's lock
    (a dry run takes none: it writes only its own scratch folder)."""
    load_engine(root, engine)
    if dry_run:
        return _rebase(
            root=root,
            engine=engine,
            to=to,
            url=url,
            commit=commit,
            force=force,
            dry_run=True,
            offline=offline,
            reporter=reporter,
        )
    with engine_lock(
        root, engine, command=f"overlay rebase {engine} --to {to}", wait=wait, reporter=reporter
    ):
        recover_refresh(root, engine, reporter=reporter)
        return _rebase(
            root=root,
            engine=engine,
            to=to,
            url=url,
            commit=commit,
            force=force,
            dry_run=False,
            offline=offline,
            reporter=reporter,
        )


def _rebase(
    *,
    root: Path,
    engine: str,
    to: str,
    url: str | None,
    commit: str | None,
    force: bool,
    dry_run: bool,
    offline: bool,
    reporter: Reporter | None,
) -> RebaseResult:
    reporter = reporter or NullReporter()
    t0 = time.perf_counter()
    manifest = load_engine(root, engine)
    sdir = state_dir(root, engine)
    if (sdir / STATE_FILE).is_file() and not dry_run:
        raise UsageError(
            f"a rebase of {engine} is already in progress ({sdir})",
            tip=f"finish it with `overlay rebase {engine} --continue` (or --skip), or give up with --abort",
        )
    version = check_version(to)
    if Version(version) == Version(manifest.upstream.version):
        raise UsageError(
            f"{engine} is already pinned at {manifest.upstream.version}; nothing to rebase",
            tip="name another release with --to",
        )
    if commit is not None and not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise UsageError(f"--commit {commit!r} is not a full 40-hex git commit id")
    if not manifest.upstream.primary.is_wheel:
        raise UsageError(
            f"{engine}: rebase needs a wheel pin, {manifest.upstream.primary.filename} is an sdist"
        )
    series = load_engine_series(root, manifest)
    if not force and not dry_run:
        _checkout_guard(root, engine)
    old = resolve_release(
        root, manifest, manifest.upstream.version, primary_only=True, offline=offline, reporter=reporter
    )
    new = resolve_release(
        root, manifest, version, url=url, primary_only=dry_run, offline=offline, reporter=reporter
    )
    root_pkg = manifest.upstream.package_root
    allow = manifest.upstream.allow_members
    old_files = wheel_tree(old.primary_path, root_pkg, allow_members=allow)
    new_files = wheel_tree(new.primary_path, root_pkg, allow_members=allow)
    new_manifest = manifest_at(manifest, version, new.artifacts)
    reporter.step(
        "rebase", f"{engine}: {manifest.upstream.version} -> {version}, {len(series.patches)} patches"
    )
    if dry_run:
        with owned_scratch(layout(root).tmp, f"rebase-{engine}") as scratch:
            ws = prepare(
                scratch / "repo",
                old_files=old_files,
                old_message=base_message(manifest),
                new_files=new_files,
                new_message=base_message(new_manifest),
                patches=series.patches,
                new_version=version,
                reporter=reporter,
            )
            outcomes = replay_all(ws, series.patches, stop=False, reporter=reporter)
            outcomes = estimate_conflicts(ws, series.patches, outcomes, reporter=reporter)
        return RebaseResult(
            engine=engine,
            from_version=manifest.upstream.version,
            to_version=version,
            status="dry-run",
            outcomes=tuple(outcomes),
            pending=(),
            repo=None,
            report=None,
            artifacts=new.artifacts,
            seconds=time.perf_counter() - t0,
            warnings=_requires_warnings(outcomes, series.patches),
        )
    if sdir.exists():
        shutil.rmtree(sdir)  # left by a run killed before it wrote its state
    sdir.mkdir(parents=True)
    try:
        ws = prepare(
            sdir / "repo",
            old_files=old_files,
            old_message=base_message(manifest),
            new_files=new_files,
            new_message=base_message(new_manifest),
            patches=series.patches,
            new_version=version,
            reporter=reporter,
        )
    except BaseException:
        shutil.rmtree(sdir, ignore_errors=True)
        raise
    report = report_path(root, engine)
    if report.is_file():
        shutil.copy2(report, sdir / "report.before.json")
    state: dict[str, Any] = {
        "version": 1,
        "engine": engine,
        "status": "running",
        "started": time.time(),
        "seconds": time.perf_counter() - t0,
        "from": {"version": manifest.upstream.version, "artifact": _artifact_json(old.primary)},
        "to": {"version": version, "artifacts": [_artifact_json(a) for a in new.artifacts], "commit": commit},
        "old_base": ws.old_base,
        "new_base": ws.new_base,
        "old_commits": list(ws.old_commits),
        "renames": {a: [b, s] for a, (b, s) in ws.renames.items()},
        "patches": [{"name": p.name, "sha256": p.sha256} for p in series.patches],
        "snapshot": _snapshot(root, manifest),
        "outcomes": [],
        "head": ws.new_base,
    }
    _save_state(sdir, state)
    return _drive(root, manifest, state, ws, series.patches, reporter, t0)


def _drive(
    root: Path,
    manifest: Manifest,
    state: dict[str, Any],
    ws: Workspace,
    patches: tuple[Patch, ...],
    reporter: Reporter,
    t0: float,
) -> RebaseResult:
    engine = manifest.name
    sdir = state_dir(root, engine)
    outcomes = [Outcome.from_json(o) for o in state["outcomes"]]
    for i in range(len(outcomes), len(patches)):
        patch = patches[i]
        out = classify(ws, i, patch, reporter=reporter)
        reporter.step(
            "rebase",
            f"[{i + 1}/{len(patches)}] {patch.name}: {out.cls}" + (f" ({out.detail})" if out.detail else ""),
        )
        outcomes.append(out)
        state["outcomes"] = [o.to_json() for o in outcomes]
        state["head"] = ws.head()
        if not out.resolved:
            state["status"] = "stopped"
            state["seconds"] = state.get("seconds", 0.0) + (time.perf_counter() - t0)
            _save_state(sdir, state)
            result = _result(root, state, outcomes, patches, "stopped", ws.repo)
            _write_report(root, state, result, patches)
            return result
    state["seconds"] = state.get("seconds", 0.0) + (time.perf_counter() - t0)
    _save_state(sdir, state)
    return _review_or_publish(root, manifest, state, ws, patches, outcomes, reporter)


def review_reasons(
    state: dict[str, Any], outcomes: Sequence[Outcome], patches: tuple[Patch, ...]
) -> tuple[str, ...]:
    """Why a finished replay must be looked at before it is published (empty: publish at once): a patch the 3-way
    merge changed, a hunk that moved to another symbol, an Overlay-Requires a drop broke, a target older than the pin."""
    out: list[str] = []
    merged = [o.name for o in outcomes if o.cls == "merged" and o.commit]
    if merged:
        out.append(
            f"{len(merged)} patch{'es' * (len(merged) != 1)} resolved by a 3-way merge, not applied as written: "
            + ", ".join(merged)
        )
    moved = [(o.name, m) for o in outcomes for m in o.moved]
    if moved:
        out.append(
            f"{len(moved)} hunk{'s' * (len(moved) != 1)} moved to another function or class: "
            + "; ".join(f"{n[:4]} {m.describe()}" for n, m in moved)
        )
    warnings = _requires_warnings(outcomes, patches)
    if warnings:
        out.append(f"{len(warnings)} Overlay-Requires broken by a dropped patch")
    a, b = state["from"]["version"], state["to"]["version"]
    if Version(b) < Version(a):
        out.append(f"the target {b} is older than the pin {a}")
    return tuple(out)


def _review_or_publish(
    root: Path,
    manifest: Manifest,
    state: dict[str, Any],
    ws: Workspace,
    patches: tuple[Patch, ...],
    outcomes: list[Outcome],
    reporter: Reporter,
) -> RebaseResult:
    reasons = review_reasons(state, outcomes, patches)
    if not reasons:
        return _publish(root, manifest, state, ws, patches, outcomes, reporter)
    state["status"] = "review"
    state["review"] = list(reasons)
    _save_state(state_dir(root, manifest.name), state)
    result = _result(root, state, outcomes, patches, "review", ws.repo)
    _write_report(root, state, result, patches)
    reporter.step("rebase", f"{manifest.name}: stopped for review before publishing ({len(reasons)} reasons)")
    return result


# ------------------------------------------------------------------ continue / skip / abort


def resume(
    *, root: Path, engine: str, skip: bool = False, wait: float = 0.0, reporter: Reporter | None = None
) -> RebaseResult:
    """``--continue`` (take the user's resolution of the stopped patch) or ``--skip`` (drop it), then go on; holds the
    engine's lock."""
    load_engine(root, engine)
    with engine_lock(
        root,
        engine,
        command=f"overlay rebase {engine} {'--skip' if skip else '--continue'}",
        wait=wait,
        reporter=reporter,
    ):
        return _resume(root=root, engine=engine, skip=skip, reporter=reporter)


def _resume(*, root: Path, engine: str, skip: bool, reporter: Reporter | None) -> RebaseResult:
    reporter = reporter or NullReporter()
    t0 = time.perf_counter()
    manifest = load_engine(root, engine)
    state = _load_state(root, engine)
    _check_snapshot(root, manifest, state)
    ws = _workspace(root, state)
    patches = _old_patches(root, manifest, state)
    outcomes = [Outcome.from_json(o) for o in state["outcomes"]]
    if state["status"] == "review":
        raise UsageError(
            f"the rebase of {engine} has every patch resolved and is stopped for review before publishing",
            tip=f"look at it (`overlay rebase {engine}` prints the table), then `overlay rebase {engine} --publish`; "
            "or --abort to give up",
        )
    if not outcomes or outcomes[-1].resolved:
        # not stopped on a patch: a run was interrupted; drop its unrecorded attempt and go on from the record
        if skip:
            raise UsageError(
                f"the rebase of {engine} is not stopped on a patch; nothing to skip",
                tip=f"`overlay rebase {engine} --continue` goes on, --abort gives up",
            )
        discard_attempt(ws.repo)
        gitops.run(["reset", "-q", "--hard", state["head"]], cwd=ws.repo)
        if len(outcomes) == len(patches):
            return _review_or_publish(root, manifest, state, ws, patches, outcomes, reporter)
        return _drive(root, manifest, state, ws, patches, reporter, t0)
    stopped = outcomes[-1]
    index = len(outcomes) - 1
    resolved = resolve_stopped(ws, patches[index], stopped, state["head"], skip=skip, engine=engine)
    reporter.step(
        "rebase", f"[{index + 1}/{len(patches)}] {stopped.name}: {stopped.cls}, {resolved.resolution}"
    )
    outcomes[-1] = resolved
    state["outcomes"] = [o.to_json() for o in outcomes]
    state["head"] = ws.head()
    state["status"] = "running"
    _save_state(state_dir(root, engine), state)
    return _drive(root, manifest, state, ws, patches, reporter, t0)


def abort(*, root: Path, engine: str, wait: float = 0.0, reporter: Reporter | None = None) -> AbortResult:
    """Forget the rebase: remove its state and scratch repository, put back the previous report. ``patches/``,
    ``overlays/`` and the checkout worktree were never touched (after an interrupted publish they are restored).

    Works from a truncated or corrupt ``state.json`` too: the publish backup is put back when it is complete (its
    ``COMPLETE`` marker is written before a publish changes anything)."""
    load_engine(root, engine)
    with engine_lock(root, engine, command=f"overlay rebase {engine} --abort", wait=wait, reporter=reporter):
        return _abort(root=root, engine=engine, reporter=reporter)


def _abort(*, root: Path, engine: str, reporter: Reporter | None) -> AbortResult:
    reporter = reporter or NullReporter()
    sdir = state_dir(root, engine)
    if not (sdir / STATE_FILE).is_file():
        if sdir.exists():
            shutil.rmtree(sdir)
            return AbortResult(engine=engine, removed=sdir, restored=())
        raise UsageError(f"no rebase of {engine} is in progress (no {sdir / STATE_FILE})")
    backup = sdir / "backup"
    try:
        publishing = _load_state(root, engine).get("status") == "publishing"
    except ConfigError:  # unreadable: a publish was under way only if its backup was complete
        publishing = (backup / BACKUP_COMPLETE).is_file()
    restored: list[str] = []
    if publishing and backup.is_dir():
        restored = _restore_backup(root, load_engine(root, engine), backup)
    before = sdir / "report.before.json"
    report = report_path(root, engine)
    if before.is_file():
        atomic_write_bytes(report, before.read_bytes())
    else:
        report.unlink(missing_ok=True)
    shutil.rmtree(sdir)
    reporter.step(
        "rebase", f"aborted: removed {sdir}" + (f", restored {len(restored)} files" if restored else "")
    )
    return AbortResult(engine=engine, removed=sdir, restored=tuple(restored))


def status(*, root: Path, engine: str) -> RebaseResult | None:
    """The rebase in progress for ``engine`` (None when there is none)."""
    if not (state_dir(root, engine) / STATE_FILE).is_file():
        return None
    manifest = load_engine(root, engine)
    state = _load_state(root, engine)
    patches = _old_patches(root, manifest, state)
    outcomes = [Outcome.from_json(o) for o in state["outcomes"]]
    status: Status = "review" if state["status"] == "review" else "stopped"
    return _result(root, state, outcomes, patches, status, state_dir(root, engine) / "repo")


# ------------------------------------------------------------------ publish


# ------------------------------------------------------------------ state, snapshot, report
