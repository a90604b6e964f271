"""Publishing a finished rebase (patch files, series, DROPPED ledger, the manifest's pin; all or nothing, with a
backup that ``--abort`` restores) and ``--undo`` of the last publish."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from overlay.core.inputs import read_inside
from overlay.core.manifest import Artifact, Manifest, load_engine, load_manifest
from overlay.core.pin_edit import Edit, apply_edits, replace_tables
from overlay.core.series import Patch, parse_patch_bytes, render_series
from overlay.errors import ConfigError, UsageError
from overlay.fsutil import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    new_file_mode,
    read_json_state,
)
from overlay.git import ops as gitops
from overlay.progress import NullReporter, Reporter
from overlay.stack.checkout import export_patches
from overlay.stack.locks import engine_lock
from overlay.upstream.outcome import Outcome
from overlay.upstream.rebase.state import (
    BACKUP_COMPLETE,
    LAST_PUBLISH,
    LEDGER,
    STATE_FILE,
    RebaseResult,
    UndoResult,
    _artifact_from_json,
    _check_snapshot,
    _load_state,
    _old_patches,
    _result,
    _save_state,
    _snapshot,
    _workspace,
    _write_report,
    history_dir,
    report_path,
    state_dir,
)
from overlay.upstream.workspace import Workspace


def publish(*, root: Path, engine: str, wait: float = 0.0, reporter: Reporter | None = None) -> RebaseResult:
    """``--publish``: publish a rebase that stopped for review (every patch resolved), holding the engine's lock."""
    load_engine(root, engine)
    with engine_lock(
        root, engine, command=f"overlay rebase {engine} --publish", wait=wait, reporter=reporter
    ):
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
            raise UsageError(
                f"the rebase of {engine} has unresolved patches", tip=f"`overlay rebase {engine} --continue`"
            )
        return _publish(root, manifest, state, ws, patches, outcomes, reporter)


def undo(*, root: Path, engine: str, wait: float = 0.0, reporter: Reporter | None = None) -> UndoResult:
    """``--undo``: put the manifest, ``series``, the patches and ``DROPPED`` back as they were before the last
    publish, byte for byte (from ``build/rebase-history/ENGINE``). Refused when they changed since that publish."""
    load_engine(root, engine)
    with engine_lock(root, engine, command=f"overlay rebase {engine} --undo", wait=wait, reporter=reporter):
        reporter = reporter or NullReporter()
        if (state_dir(root, engine) / STATE_FILE).is_file():
            raise UsageError(
                f"a rebase of {engine} is in progress; --undo undoes a published one",
                tip=f"`overlay rebase {engine} --abort` gives up the one in progress",
            )
        record_path = history_dir(root, engine) / LAST_PUBLISH
        if not record_path.is_file():
            raise UsageError(
                f"no published rebase of {engine} to undo (no {record_path})",
                tip="--undo works once, right after `overlay rebase` published",
            )
        record = read_json_state(record_path, what="last publish record", tip=f"remove {record_path}")
        hist = history_dir(root, engine) / (str(record.get("dir", "")) if isinstance(record, dict) else "")
        if (
            not isinstance(record, dict)
            or not record.get("dir")
            or not (hist / "old" / "series").is_file()
            or not (hist / "manifest.toml").is_file()
        ):
            raise ConfigError(
                f"{record_path} names no complete copy of the series before the publish ({hist})",
                tip=f"restore patches/{engine} and overlays/{engine}.toml from version control",
            )
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
        return UndoResult(
            engine=engine,
            from_version=str(record["from"]),
            to_version=str(record["to"]),
            restored=tuple(restored),
        )


def _publish(
    root: Path,
    manifest: Manifest,
    state: dict[str, Any],
    ws: Workspace,
    patches: tuple[Patch, ...],
    outcomes: list[Outcome],
    reporter: Reporter,
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
    series_text = _series_text(
        read_inside(root, series_dir / "series", what="series file").decode("utf-8"),
        engine,
        version,
        to.get("commit"),
        [n for n, _d in new_files],
        previous={v: k for k, v in named.items()},
    )
    dropped = [o for o in outcomes if o.dropped]
    ledger_path = series_dir / LEDGER
    ledger_text = _ledger_text(
        ledger_path.read_text(encoding="utf-8") if ledger_path.is_file() else "",
        dropped,
        by_name,
        state["from"]["version"],
        version,
    )
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
        result = _result(
            root, state, outcomes, patches, "published", None, series=tuple(n for n, _d in new_files)
        )
        _write_report(root, state, result, patches)
        shutil.copy2(report_path(root, engine), hist / "report.json")
        atomic_write_json(
            history_dir(root, engine) / LAST_PUBLISH,
            {
                "version": 1,
                "engine": engine,
                "from": state["from"]["version"],
                "to": version,
                "dir": hist.name,
                "published": _snapshot(root, manifest),
            },
        )
    except BaseException:  # put the old series back now; when that fails too, --abort does it from the backup
        with contextlib.suppress(Exception):
            _restore_backup(root, manifest, backup)
            state["status"] = "running"
            _save_state(sdir, state)
        raise
    shutil.rmtree(sdir)
    reporter.step(
        "rebase", f"published: {engine} {version}, {len(new_files)} patches, {len(dropped)} dropped"
    )
    return result


def edited_manifest(
    manifest: Manifest, version: str, artifacts: tuple[Artifact, ...], commit: str | None
) -> str:
    """The manifest text with the pin moved to ``version`` (values edited in place), checked by loading it."""
    old = manifest.upstream
    edits = [Edit("upstream", "version", version)]
    if old.tag:
        if old.version in old.tag:
            edits.append(Edit("upstream", "tag", old.tag.replace(old.version, version)))
        else:
            edits.append(
                Edit(
                    "upstream",
                    "tag",
                    None,
                    comment=f"tag: unknown for {version} (was {old.tag!r} for {old.version})",
                )
            )
    if commit:
        edits.append(Edit("upstream", "commit", commit))
    elif old.commit:
        edits.append(
            Edit(
                "upstream",
                "commit",
                None,
                comment=f"commit: unknown for {version}; `overlay rebase` dropped {old.commit} ({old.version}). "
                "Set it when established (`apply --source git` needs it).",
            )
        )
    text = manifest.path.read_text(encoding="utf-8")
    if len(artifacts) == len(
        old.artifacts
    ):  # the same set of files: edit each table in place (its comments stay)
        for i, (a, b) in enumerate(zip(old.artifacts, artifacts)):
            edits.append(Edit("upstream.artifacts", "filename", b.filename, index=i))
            edits.append(Edit("upstream.artifacts", "sha256", b.sha256, index=i))
            if b.url or a.url:
                edits.append(
                    Edit(
                        "upstream.artifacts",
                        "url",
                        b.url,
                        index=i,
                        comment=None
                        if b.url
                        else "url: removed by `overlay rebase` (the new artifact is on the index)",
                    )
                )
    else:  # the release has more or fewer files than the pinned one: the artifact tables are written anew
        rows = [
            {"filename": b.filename, "sha256": b.sha256, **({"url": b.url} if b.url else {})}
            for b in artifacts
        ]
        text = replace_tables(
            text,
            "upstream.artifacts",
            rows,
            where=str(manifest.path),
            comment=f"{len(artifacts)} files of {version} (`overlay rebase`; {old.version} had "
            f"{len(old.artifacts)})",
        )
    text = apply_edits(text, edits, where=str(manifest.path))
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / manifest.path.name
        probe.write_text(text, encoding="utf-8")
        loaded = load_manifest(probe)
    if loaded.upstream.version != version or tuple(a.sha256 for a in loaded.upstream.artifacts) != tuple(
        a.sha256 for a in artifacts
    ):
        raise ConfigError(
            f"{manifest.path}: editing the pin in place did not give the expected values; edit it by hand"
        )
    return text


def _series_text(
    old: str,
    engine: str,
    version: str,
    commit: str | None,
    names: list[str],
    previous: dict[str, str] | None = None,
) -> str:
    """The new ``series``: the new base line, the rebased names, the old file's comments and blank lines kept with
    their entries (:func:`overlay.core.series.render_series`, the writer ``refresh`` uses too)."""
    return render_series(
        old, header=f"# base: {engine} {version} {commit or '-'}", names=names, previous=previous
    )


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


def _restore_backup(
    root: Path, manifest: Manifest, backup: Path, *, series_name: str = "series"
) -> list[str]:
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
