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

import contextlib
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from packaging.version import Version

from overlay.core.inputs import read_inside
from overlay.core.manifest import Artifact, Manifest, check_engine_name, load_engine, load_manifest
from overlay.core.pin_edit import Edit, apply_edits, replace_tables
from overlay.core.series import Patch, load_engine_series, parse_patch_bytes, render_series
from overlay.errors import ConfigError, UsageError
from overlay.fsutil import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    new_file_mode,
    owned_scratch,
    read_json_state,
    sha256_bytes,
)
from overlay.git import ops as gitops
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter
from overlay.stack.checkout import base_message, default_worktree, export_patches, read_state
from overlay.stack.locks import engine_lock
from overlay.stack.transaction import recover_refresh
from overlay.upstream.releases import check_version, manifest_at, resolve_release, wheel_tree
from overlay.upstream.replay import (
    CLASSES,
    Outcome,
    Workspace,
    classify,
    discard_attempt,
    estimate_conflicts,
    prepare,
    replay_all,
    resolve_stopped,
)

STATE_FILE = "state.json"
BACKUP_COMPLETE = "COMPLETE"
LEDGER = "DROPPED"
Status = Literal["published", "stopped", "review", "dry-run"]
LAST_PUBLISH = "last-publish.json"


def state_dir(root: Path, engine: str) -> Path:
    return layout(root).rebase / check_engine_name(engine)


def history_dir(root: Path, engine: str) -> Path:
    return layout(root).rebase_history / check_engine_name(engine)


def report_path(root: Path, engine: str) -> Path:
    return layout(root).reports / f"{engine}-rebase.json"


@dataclass(frozen=True)
class RebaseResult:
    engine: str
    from_version: str
    to_version: str
    status: Status
    outcomes: tuple[Outcome, ...]
    pending: tuple[str, ...]  # patches not reached yet (after a stop)
    repo: Path | None  # the scratch repository while stopped
    report: Path | None
    artifacts: tuple[Artifact, ...]
    series: tuple[str, ...] = ()  # the published series
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()  # Overlay-Requires that a dropped or skipped patch broke (lint refuses them)
    review: tuple[str, ...] = ()  # why the rebase stopped before publishing (status "review")
    # the report as written to build/reports/ENGINE-rebase.json (`--json` prints this same document)
    document: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def stopped(self) -> Outcome | None:
        if self.status != "stopped" or not self.outcomes or self.outcomes[-1].resolved:
            return None
        return self.outcomes[-1]

    def counts(self) -> dict[str, int]:
        return {c: sum(1 for o in self.outcomes if o.cls == c) for c in CLASSES}


@dataclass(frozen=True)
class AbortResult:
    engine: str
    removed: Path
    restored: tuple[str, ...]  # files put back from the publish backup (only after an interrupted publish)


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
        return _rebase(root=root, engine=engine, to=to, url=url, commit=commit, force=force, dry_run=True,
                       offline=offline, reporter=reporter)
    with engine_lock(root, engine, command=f"overlay rebase {engine} --to {to}", wait=wait, reporter=reporter):
        recover_refresh(root, engine, reporter=reporter)
        return _rebase(root=root, engine=engine, to=to, url=url, commit=commit, force=force, dry_run=False,
                       offline=offline, reporter=reporter)


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
        raise UsageError(f"{engine} is already pinned at {manifest.upstream.version}; nothing to rebase",
                         tip="name another release with --to")
    if commit is not None and not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise UsageError(f"--commit {commit!r} is not a full 40-hex git commit id")
    if not manifest.upstream.primary.is_wheel:
        raise UsageError(f"{engine}: rebase needs a wheel pin, {manifest.upstream.primary.filename} is an sdist")
    series = load_engine_series(root, manifest)
    if not force and not dry_run:
        _checkout_guard(root, engine)
    old = resolve_release(root, manifest, manifest.upstream.version, primary_only=True, offline=offline, reporter=reporter)
    new = resolve_release(root, manifest, version, url=url, primary_only=dry_run, offline=offline, reporter=reporter)
    root_pkg = manifest.upstream.package_root
    allow = manifest.upstream.allow_members
    old_files = wheel_tree(old.primary_path, root_pkg, allow_members=allow)
    new_files = wheel_tree(new.primary_path, root_pkg, allow_members=allow)
    new_manifest = manifest_at(manifest, version, new.artifacts)
    reporter.step("rebase", f"{engine}: {manifest.upstream.version} -> {version}, {len(series.patches)} patches")
    if dry_run:
        with owned_scratch(layout(root).tmp, f"rebase-{engine}") as scratch:
            ws = prepare(scratch / "repo", old_files=old_files, old_message=base_message(manifest), new_files=new_files,
                         new_message=base_message(new_manifest), patches=series.patches, new_version=version,
                         reporter=reporter)
            outcomes = replay_all(ws, series.patches, stop=False, reporter=reporter)
            outcomes = estimate_conflicts(ws, series.patches, outcomes, reporter=reporter)
        return RebaseResult(engine=engine, from_version=manifest.upstream.version, to_version=version, status="dry-run",
                            outcomes=tuple(outcomes), pending=(), repo=None, report=None, artifacts=new.artifacts,
                            seconds=time.perf_counter() - t0, warnings=_requires_warnings(outcomes, series.patches))
    if sdir.exists():
        shutil.rmtree(sdir)  # left by a run killed before it wrote its state
    sdir.mkdir(parents=True)
    try:
        ws = prepare(sdir / "repo", old_files=old_files, old_message=base_message(manifest), new_files=new_files,
                     new_message=base_message(new_manifest), patches=series.patches, new_version=version, reporter=reporter)
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
    root: Path, manifest: Manifest, state: dict[str, Any], ws: Workspace, patches: tuple[Patch, ...],
    reporter: Reporter, t0: float,
) -> RebaseResult:
    engine = manifest.name
    sdir = state_dir(root, engine)
    outcomes = [Outcome.from_json(o) for o in state["outcomes"]]
    for i in range(len(outcomes), len(patches)):
        patch = patches[i]
        out = classify(ws, i, patch, reporter=reporter)
        reporter.step("rebase", f"[{i + 1}/{len(patches)}] {patch.name}: {out.cls}" + (f" ({out.detail})" if out.detail else ""))
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


def review_reasons(state: dict[str, Any], outcomes: Sequence[Outcome], patches: tuple[Patch, ...]) -> tuple[str, ...]:
    """Why a finished replay must be looked at before it is published (empty: publish at once): a patch the 3-way
    merge changed, a hunk that moved to another symbol, an Overlay-Requires a drop broke, a target older than the pin."""
    out: list[str] = []
    merged = [o.name for o in outcomes if o.cls == "merged" and o.commit]
    if merged:
        out.append(f"{len(merged)} patch{'es' * (len(merged) != 1)} resolved by a 3-way merge, not applied as written: "
                   + ", ".join(merged))
    moved = [(o.name, m) for o in outcomes for m in o.moved]
    if moved:
        out.append(f"{len(moved)} hunk{'s' * (len(moved) != 1)} moved to another function or class: "
                   + "; ".join(f"{n[:4]} {m.describe()}" for n, m in moved))
    warnings = _requires_warnings(outcomes, patches)
    if warnings:
        out.append(f"{len(warnings)} Overlay-Requires broken by a dropped patch")
    a, b = state["from"]["version"], state["to"]["version"]
    if Version(b) < Version(a):
        out.append(f"the target {b} is older than the pin {a}")
    return tuple(out)


def _review_or_publish(
    root: Path, manifest: Manifest, state: dict[str, Any], ws: Workspace, patches: tuple[Patch, ...],
    outcomes: list[Outcome], reporter: Reporter,
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


def publish(*, root: Path, engine: str, wait: float = 0.0, reporter: Reporter | None = None) -> RebaseResult:
    """``--publish``: publish a rebase that stopped for review (every patch resolved), holding the engine's lock."""
    load_engine(root, engine)
    with engine_lock(root, engine, command=f"overlay rebase {engine} --publish", wait=wait, reporter=reporter):
        reporter = reporter or NullReporter()
        manifest = load_engine(root, engine)
        state = _load_state(root, engine)
        if state["status"] != "review":
            raise UsageError(
                f"the rebase of {engine} is not waiting for review (status {state['status']!r}); nothing to publish yet",
                tip=f"finish it with `overlay rebase {engine} --continue` (or --skip), or give up with --abort",
            )
        _check_snapshot(root, manifest, state)
        ws = _workspace(root, state)
        patches = _old_patches(root, manifest, state)
        outcomes = [Outcome.from_json(o) for o in state["outcomes"]]
        if len(outcomes) != len(patches) or not all(o.resolved for o in outcomes):
            raise UsageError(f"the rebase of {engine} has unresolved patches", tip=f"`overlay rebase {engine} --continue`")
        return _publish(root, manifest, state, ws, patches, outcomes, reporter)


# ------------------------------------------------------------------ continue / skip / abort


def resume(
    *, root: Path, engine: str, skip: bool = False, wait: float = 0.0, reporter: Reporter | None = None
) -> RebaseResult:
    """``--continue`` (take the user's resolution of the stopped patch) or ``--skip`` (drop it), then go on; holds the
    engine's lock."""
    load_engine(root, engine)
    with engine_lock(root, engine, command=f"overlay rebase {engine} {'--skip' if skip else '--continue'}", wait=wait,
                     reporter=reporter):
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
            raise UsageError(f"the rebase of {engine} is not stopped on a patch; nothing to skip",
                             tip=f"`overlay rebase {engine} --continue` goes on, --abort gives up")
        discard_attempt(ws.repo)
        gitops.run(["reset", "-q", "--hard", state["head"]], cwd=ws.repo)
        if len(outcomes) == len(patches):
            return _review_or_publish(root, manifest, state, ws, patches, outcomes, reporter)
        return _drive(root, manifest, state, ws, patches, reporter, t0)
    stopped = outcomes[-1]
    index = len(outcomes) - 1
    resolved = resolve_stopped(ws, patches[index], stopped, state["head"], skip=skip, engine=engine)
    reporter.step("rebase", f"[{index + 1}/{len(patches)}] {stopped.name}: {stopped.cls}, {resolved.resolution}")
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
    reporter.step("rebase", f"aborted: removed {sdir}" + (f", restored {len(restored)} files" if restored else ""))
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


@dataclass(frozen=True)
class UndoResult:
    engine: str
    from_version: str  # the pin restored
    to_version: str  # the pin undone
    restored: tuple[str, ...]


def undo(*, root: Path, engine: str, wait: float = 0.0, reporter: Reporter | None = None) -> UndoResult:
    """``--undo``: put the manifest, ``series``, the patches and ``DROPPED`` back as they were before the last
    publish, byte for byte (from ``build/rebase-history/ENGINE``). Refused when they changed since that publish."""
    load_engine(root, engine)
    with engine_lock(root, engine, command=f"overlay rebase {engine} --undo", wait=wait, reporter=reporter):
        reporter = reporter or NullReporter()
        if (state_dir(root, engine) / STATE_FILE).is_file():
            raise UsageError(f"a rebase of {engine} is in progress; --undo undoes a published one",
                             tip=f"`overlay rebase {engine} --abort` gives up the one in progress")
        record_path = history_dir(root, engine) / LAST_PUBLISH
        if not record_path.is_file():
            raise UsageError(f"no published rebase of {engine} to undo (no {record_path})",
                             tip="--undo works once, right after `overlay rebase` published")
        record = read_json_state(record_path, what="last publish record", tip=f"remove {record_path}")
        hist = history_dir(root, engine) / (str(record.get("dir", "")) if isinstance(record, dict) else "")
        if not isinstance(record, dict) or not record.get("dir") or not (hist / "old" / "series").is_file() \
                or not (hist / "manifest.toml").is_file():
            raise ConfigError(f"{record_path} names no complete copy of the series before the publish ({hist})",
                              tip=f"restore patches/{engine} and overlays/{engine}.toml from version control")
        manifest = load_engine(root, engine)
        if _snapshot(root, manifest) != record.get("published"):
            raise UsageError(
                f"patches/{engine} or {manifest.path.name} changed since the rebase {record['from']} -> {record['to']} "
                "was published; undoing now would throw that away",
                tip="put them back as the rebase left them, or restore the old series from version control",
            )
        restored = _restore_backup(root, manifest, hist, series_name="old")
        record_path.unlink()
        reporter.step("rebase", f"undone: {engine} back at {record['from']} ({len(restored)} files put back)")
        return UndoResult(engine=engine, from_version=str(record["from"]), to_version=str(record["to"]),
                          restored=tuple(restored))


# ------------------------------------------------------------------ publish


def _publish(
    root: Path, manifest: Manifest, state: dict[str, Any], ws: Workspace, patches: tuple[Patch, ...],
    outcomes: list[Outcome], reporter: Reporter,
) -> RebaseResult:
    engine = manifest.name
    sdir = state_dir(root, engine)
    _check_snapshot(root, manifest, state)
    kept = [o for o in outcomes if o.commit]
    commits = gitops.out(["rev-list", "--reverse", f"{ws.new_base}..HEAD"], cwd=ws.repo).split()
    if commits != [o.commit for o in kept]:
        raise UsageError(
            f"{ws.repo}: its history no longer matches the rebase's record ({len(commits)} commits, expected {len(kept)})",
            tip=f"undo what was done there by hand, or `overlay rebase {engine} --abort` and start again",
        )
    by_name = {p.name: p for p in patches}
    new_files: list[tuple[str, bytes]] = []
    named: dict[str, str] = {}
    with tempfile.TemporaryDirectory(dir=sdir) as tmp:
        exported = export_patches(ws.repo, ws.new_base, Path(tmp) / "out") if kept else []
        if len(exported) != len(kept):
            raise UsageError(f"git format-patch wrote {len(exported)} files for {len(kept)} commits")
        for pos, (o, path) in enumerate(zip(kept, exported), start=1):
            data = by_name[o.name].raw if o.kept_bytes else path.read_bytes()
            name = f"{pos:04d}-{o.name[5:]}"
            parse_patch_bytes(data, name=name, where=f"rebased {o.name}")
            new_files.append((name, data))
            named[o.name] = name
    outcomes = [replace(o, new_name=named.get(o.name)) for o in outcomes]
    to = state["to"]
    version = to["version"]
    new_artifacts = tuple(_artifact_from_json(a) for a in to["artifacts"])
    series_dir = manifest.series_dir(root)
    series_text = _series_text(read_inside(root, series_dir / "series", what="series file").decode("utf-8"), engine, version, to.get("commit"),
                               [n for n, _d in new_files], previous={v: k for k, v in named.items()})
    dropped = [o for o in outcomes if o.dropped]
    ledger_path = series_dir / LEDGER
    ledger_text = _ledger_text(ledger_path.read_text(encoding="utf-8") if ledger_path.is_file() else "",
                               dropped, by_name, state["from"]["version"], version)
    manifest_text = edited_manifest(manifest, version, new_artifacts, to.get("commit"))
    # write, keeping a backup so an interrupted publish can be undone with --abort
    backup = sdir / "backup"
    if backup.exists():
        shutil.rmtree(backup)
    shutil.copytree(series_dir, backup / "series")
    shutil.copy2(manifest.path, backup / "manifest.toml")
    atomic_write_text(backup / BACKUP_COMPLETE, "the publish backup is complete\n")
    state["status"] = "publishing"
    _save_state(sdir, state)
    try:
        for name, data in new_files:
            target = series_dir / name
            if not target.is_file() or target.read_bytes() != data:
                atomic_write_bytes(target, data)
        if dropped:
            atomic_write_text(ledger_path, ledger_text)
        atomic_write_text(series_dir / "series", series_text)
        keep = {n for n, _d in new_files}
        for old in series_dir.glob("*.patch"):
            if old.name not in keep:
                old.unlink()
        atomic_write_text(manifest.path, manifest_text)
        hist = history_dir(root, engine) / f"{state['from']['version']}-to-{version}"
        if hist.exists():
            shutil.rmtree(hist)
        hist.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(backup / "series", hist / "old")
        shutil.copy2(backup / "manifest.toml", hist / "manifest.toml")
        result = _result(root, state, outcomes, patches, "published", None, series=tuple(n for n, _d in new_files))
        _write_report(root, state, result, patches)
        shutil.copy2(report_path(root, engine), hist / "report.json")
        atomic_write_json(history_dir(root, engine) / LAST_PUBLISH, {
            "version": 1, "engine": engine, "from": state["from"]["version"], "to": version, "dir": hist.name,
            "published": _snapshot(root, manifest)})
    except BaseException:  # put the old series back now; when that fails too, --abort does it from the backup
        with contextlib.suppress(Exception):
            _restore_backup(root, manifest, backup)
            state["status"] = "running"
            _save_state(sdir, state)
        raise
    shutil.rmtree(sdir)
    reporter.step("rebase", f"published: {engine} {version}, {len(new_files)} patches, {len(dropped)} dropped")
    return result


def edited_manifest(manifest: Manifest, version: str, artifacts: tuple[Artifact, ...], commit: str | None) -> str:
    """The manifest text with the pin moved to ``version`` (values edited in place), checked by loading it."""
    old = manifest.upstream
    edits = [Edit("upstream", "version", version)]
    if old.tag:
        if old.version in old.tag:
            edits.append(Edit("upstream", "tag", old.tag.replace(old.version, version)))
        else:
            edits.append(Edit("upstream", "tag", None, comment=f"tag: unknown for {version} (was {old.tag!r} for {old.version})"))
    if commit:
        edits.append(Edit("upstream", "commit", commit))
    elif old.commit:
        edits.append(Edit("upstream", "commit", None,
                          comment=f"commit: unknown for {version}; `overlay rebase` dropped {old.commit} ({old.version}). "
                          "Set it when established (`apply --source git` needs it)."))
    text = manifest.path.read_text(encoding="utf-8")
    if len(artifacts) == len(old.artifacts):  # the same set of files: edit each table in place (its comments stay)
        for i, (a, b) in enumerate(zip(old.artifacts, artifacts)):
            edits.append(Edit("upstream.artifacts", "filename", b.filename, index=i))
            edits.append(Edit("upstream.artifacts", "sha256", b.sha256, index=i))
            if b.url or a.url:
                edits.append(Edit("upstream.artifacts", "url", b.url, index=i,
                                  comment=None if b.url else "url: removed by `overlay rebase` (the new artifact is on the index)"))
    else:  # the release has more or fewer files than the pinned one: the artifact tables are written anew
        rows = [{"filename": b.filename, "sha256": b.sha256, **({"url": b.url} if b.url else {})} for b in artifacts]
        text = replace_tables(text, "upstream.artifacts", rows, where=str(manifest.path),
                              comment=f"{len(artifacts)} files of {version} (`overlay rebase`; {old.version} had "
                                      f"{len(old.artifacts)})")
    text = apply_edits(text, edits, where=str(manifest.path))
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / manifest.path.name
        probe.write_text(text, encoding="utf-8")
        loaded = load_manifest(probe)
    if loaded.upstream.version != version or tuple(a.sha256 for a in loaded.upstream.artifacts) != tuple(
        a.sha256 for a in artifacts
    ):
        raise ConfigError(f"{manifest.path}: editing the pin in place did not give the expected values; edit it by hand")
    return text


def _series_text(old: str, engine: str, version: str, commit: str | None, names: list[str],
                 previous: dict[str, str] | None = None) -> str:
    """The new ``series``: the new base line, the rebased names, the old file's comments and blank lines kept with
    their entries (:func:`overlay.core.series.render_series`, the writer ``refresh`` uses too)."""
    return render_series(old, header=f"# base: {engine} {version} {commit or '-'}", names=names, previous=previous)


LEDGER_HEADER = """\
# Patches dropped from this series, oldest first. Appended by `overlay rebase`; keep it.
# One block per patch (`key: value` lines, blocks separated by a blank line): the patch file as it was, its
# subject and sha256, the rebase that dropped it, the upstream version that no longer needs it, and why.
"""


def _ledger_text(old: str, dropped: list[Outcome], by_name: dict[str, Patch], from_v: str, to_v: str) -> str:
    text = old if old.strip() else LEDGER_HEADER
    if not text.endswith("\n"):
        text += "\n"
    for o in dropped:
        patch = by_name[o.name]
        if o.cls == "upstreamed":
            reason = f"upstreamed: {o.detail}"
        elif o.resolution == "skipped":
            reason = f"{o.cls}, skipped by the user during the rebase: {o.detail}"
        else:
            reason = f"{o.cls}, resolved to no change by the user: {o.detail}"
        block = [
            f"patch: {o.name}",
            f"subject: {patch.subject}",
            f"sha256: {patch.sha256}",
            f"rebase: {from_v} -> {to_v}",
            f"upstream: {to_v}",
            f"reason: {reason}",
            f"upstream-status: {patch.upstream_status or '-'}",
        ]
        text += "\n" + "\n".join(block) + "\n"
    return text


# ------------------------------------------------------------------ state, snapshot, report


def _save_state(sdir: Path, state: dict[str, Any]) -> None:
    atomic_write_json(sdir / STATE_FILE, state)


def _load_state(root: Path, engine: str) -> dict[str, Any]:
    path = state_dir(root, engine) / STATE_FILE
    if not path.is_file():
        raise UsageError(f"no rebase of {engine} is in progress (no {path})",
                         tip=f"start one with `overlay rebase {engine} --to VERSION`")
    tip = (f"`overlay rebase {engine} --abort` discards the rebase (patches/ and overlays/ are put back from its "
           "backup if a publish was interrupted)")
    data = read_json_state(path, what="rebase state", tip=tip)
    problem = _state_problem(data, engine)
    if problem:
        raise ConfigError(f"rebase state {path} has the wrong shape: {problem}", tip=tip)
    state: dict[str, Any] = data
    return state


def _state_problem(data: Any, engine: str) -> str:
    """What is wrong with a parsed ``state.json`` ("" when it has the shape this module writes)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, expected an object"
    if data.get("version") != 1:
        return f"version {data.get('version')!r}, expected 1"
    if data.get("engine") != engine:
        return f"engine {data.get('engine')!r}, expected {engine!r}"
    if data.get("status") not in ("running", "stopped", "review", "publishing"):
        return f"status {data.get('status')!r}"
    for key in ("old_base", "new_base", "head"):
        if not isinstance(data.get(key), str):
            return f"{key!r} is {data.get(key)!r}, expected a commit id"
    frm, to = data.get("from"), data.get("to")
    if not isinstance(frm, dict) or not isinstance(frm.get("version"), str):
        return "'from' has no version"
    if not isinstance(to, dict) or not isinstance(to.get("version"), str) or not isinstance(to.get("artifacts"), list):
        return "'to' has no version or artifacts"
    if not all(isinstance(a, dict) and isinstance(a.get("filename"), str) and isinstance(a.get("sha256"), str)
               for a in to["artifacts"]):
        return "'to.artifacts' is not a list of {filename, sha256}"
    if not isinstance(data.get("old_commits"), list) or not all(isinstance(c, str) for c in data["old_commits"]):
        return "'old_commits' is not a list of commit ids"
    if not isinstance(data.get("patches"), list) or not all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("sha256"), str)
        for p in data["patches"]
    ):
        return "'patches' is not a list of {name, sha256}"
    snap = data.get("snapshot")
    if not isinstance(snap, dict) or not isinstance(snap.get("manifest"), str) or not isinstance(snap.get("series"), dict):
        return "'snapshot' has no manifest hash or series"
    renames = data.get("renames", {})
    if not isinstance(renames, dict) or not all(isinstance(v, list) and len(v) == 2 for v in renames.values()):
        return "'renames' is not a map of [path, similarity]"
    if not isinstance(data.get("outcomes"), list):
        return "'outcomes' is not a list"
    try:
        for o in data["outcomes"]:
            Outcome.from_json(o)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"an entry of 'outcomes' does not read ({type(exc).__name__}: {exc})"
    return ""


def _workspace(root: Path, state: dict[str, Any]) -> Workspace:
    return Workspace(
        repo=state_dir(root, state["engine"]) / "repo",
        old_base=state["old_base"],
        new_base=state["new_base"],
        old_commits=tuple(state["old_commits"]),
        new_version=state["to"]["version"],
        renames={a: (b, int(s)) for a, (b, s) in state.get("renames", {}).items()},
    )


def _old_patches(root: Path, manifest: Manifest, state: dict[str, Any]) -> tuple[Patch, ...]:
    series = load_engine_series(root, manifest)
    recorded = [(p["name"], p["sha256"]) for p in state["patches"]]
    if [(p.name, p.sha256) for p in series.patches] != recorded:
        raise UsageError(
            f"patches/{manifest.name} changed while the rebase was stopped",
            tip=f"put it back, or `overlay rebase {manifest.name} --abort` and start again",
        )
    return series.patches


def _snapshot(root: Path, manifest: Manifest) -> dict[str, Any]:
    series_dir = manifest.series_dir(root)
    return {
        "manifest": sha256_bytes(manifest.path.read_bytes()),
        "series": {p.name: sha256_bytes(p.read_bytes()) for p in sorted(series_dir.iterdir()) if p.is_file()},
    }


def _check_snapshot(root: Path, manifest: Manifest, state: dict[str, Any]) -> None:
    now = _snapshot(root, manifest)
    if now != state["snapshot"]:
        what = manifest.path.name if now["manifest"] != state["snapshot"]["manifest"] else f"patches/{manifest.name}"
        raise UsageError(
            f"{what} changed while the rebase of {manifest.name} was in progress; publishing now would overwrite that",
            tip=f"undo the change, or `overlay rebase {manifest.name} --abort` and start again",
        )


def _restore_backup(root: Path, manifest: Manifest, backup: Path, *, series_name: str = "series") -> list[str]:
    series_dir = manifest.series_dir(root)
    restored = []
    saved = {p.name for p in (backup / series_name).iterdir()}
    for p in series_dir.iterdir():
        if p.is_file() and p.name not in saved:
            p.unlink()
            restored.append(str(p))
    for p in sorted((backup / series_name).iterdir()):
        target = series_dir / p.name
        if not target.is_file() or target.read_bytes() != p.read_bytes():
            atomic_write_bytes(target, p.read_bytes(), mode=new_file_mode(p))
            restored.append(str(target))
    saved_manifest = (backup / "manifest.toml").read_bytes()
    if manifest.path.read_bytes() != saved_manifest:
        atomic_write_bytes(manifest.path, saved_manifest)
        restored.append(str(manifest.path))
    return restored


def _checkout_guard(root: Path, engine: str) -> None:
    """Refuse to rebase under a checkout worktree that holds work ``refresh`` has not written back."""
    wt = default_worktree(root, engine)
    if not (wt / ".git").is_dir():
        return
    tip = (f"`overlay refresh {engine}` first (or discard the work), or pass --force to rebase the series as it is in "
           f"patches/{engine} (the worktree stays on the old base)")
    # --no-optional-locks: looking must not rewrite the worktree's index (abort promises a byte-identical worktree)
    dirty = gitops.status_paths(wt, optional_locks=False)
    if dirty:
        raise UsageError(f"{wt} has uncommitted changes ({', '.join(dirty[:3])}{' ...' if len(dirty) > 3 else ''})", tip=tip)
    try:
        st = read_state(wt, engine=engine)
    except UsageError:
        return
    proc = gitops.run(["rev-list", "--reverse", "--end-of-options", f"{st['base']}..HEAD"], cwd=wt, check=False)
    commits = proc.stdout.decode().split()
    if proc.returncode != 0 or commits != [p["commit"] for p in st.get("patches", [])]:
        raise UsageError(f"{wt} has commits that `overlay refresh` has not written back to patches/{engine}", tip=tip)


def _artifact_json(a: Artifact) -> dict[str, str]:
    d = {"filename": a.filename, "sha256": a.sha256}
    if a.url:
        d["url"] = a.url
    return d


def _artifact_from_json(d: dict[str, str]) -> Artifact:
    return Artifact(filename=d["filename"], sha256=d["sha256"], url=d.get("url"))


def _result(
    root: Path, state: dict[str, Any], outcomes: list[Outcome], patches: tuple[Patch, ...], status: Status,
    repo: Path | None, *, series: tuple[str, ...] = (),
) -> RebaseResult:
    result = RebaseResult(
        engine=state["engine"],
        from_version=state["from"]["version"],
        to_version=state["to"]["version"],
        status=status,
        outcomes=tuple(outcomes),
        pending=tuple(p.name for p in patches[len(outcomes):]),
        repo=repo,
        report=report_path(root, state["engine"]),
        artifacts=tuple(_artifact_from_json(a) for a in state["to"]["artifacts"]),
        series=series,
        seconds=float(state.get("seconds", 0.0)),
        warnings=_requires_warnings(outcomes, patches),
        review=tuple(state.get("review", ())) if status == "review" else (),
    )
    return replace(result, document=report_json(result, patches, state))


def _requires_warnings(outcomes: Sequence[Outcome], patches: tuple[Patch, ...]) -> tuple[str, ...]:
    """The Overlay-Requires of the patches still in the series (kept or not reached) that a drop or --skip broke."""
    from overlay.core.lint import requires_warnings

    dropped = {o.name for o in outcomes if o.dropped}
    return requires_warnings([p for p in patches if p.name not in dropped])


def report_json(result: RebaseResult, patches: tuple[Patch, ...] = (), state: dict[str, Any] | None = None) -> dict[str, Any]:
    by_name = {p.name: p for p in patches}
    stopped = result.stopped
    return {
        "version": 1,
        "engine": result.engine,
        "status": result.status,
        "from": state["from"] if state else {"version": result.from_version},
        "to": state["to"] if state else {"version": result.to_version,
                                         "artifacts": [_artifact_json(a) for a in result.artifacts]},
        "patches": [
            {**o.to_json(), "upstream_status": by_name[o.name].upstream_status if o.name in by_name else None}
            for o in result.outcomes
        ] + [{"name": n, "class": None, "resolution": "not reached"} for n in result.pending],
        "counts": result.counts(),
        "conflicts": {"own": sum(1 for o in result.outcomes if o.conflict_kind == "own"),
                      "inherited": sum(1 for o in result.outcomes if o.conflict_kind == "inherited")},
        "stopped": None if stopped is None else {
            "patch": stopped.name, "class": stopped.cls, "detail": stopped.detail,
            "paths": list(stopped.conflicts or stopped.gone or [r[0] for r in stopped.renames]),
            "worktree": str(result.repo) if result.repo else None,
        },
        "series": list(result.series),
        "bases": {"old": state["old_base"], "new": state["new_base"]} if state else None,
        "seconds": round(result.seconds, 3),
        "warnings": list(result.warnings),
        "review": list(result.review),
    }


def _write_report(root: Path, state: dict[str, Any], result: RebaseResult, patches: tuple[Patch, ...]) -> None:
    atomic_write_json(report_path(root, state["engine"]), dict(result.document or report_json(result, patches, state)))
