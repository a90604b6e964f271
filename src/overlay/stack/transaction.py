"""The refresh transaction: several files replaced all or nothing, with a journal a killed run is rolled back from."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

from overlay.errors import ConfigError
from overlay.fsutil import atomic_write_bytes, atomic_write_json, new_file_mode, publish_file, read_json_state
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter

JOURNAL = "journal.json"


def refresh_txn_dir(root: Path, engine: str) -> Path:
    return layout(root).refresh / engine


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
        atomic_write_json(
            txn / JOURNAL, {"version": 1, "engine": engine, "status": "publishing", "targets": entries}
        )
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
            with contextlib.suppress(
                Exception
            ):  # when undoing fails too, the journal stays: the next run rolls back
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
        tip = f"the files it replaced are in {txn / 'backup'}; put back what you need by hand, then remove {txn}"
        data = read_json_state(journal, what="refresh journal", tip=tip)
        entries = data.get("targets") if isinstance(data, dict) else None
        if not isinstance(entries, list) or not all(
            isinstance(e, dict)
            and isinstance(e.get("path"), str)
            and isinstance(e.get("key"), str)
            and isinstance(e.get("backup"), bool)
            for e in entries
        ):
            raise ConfigError(f"refresh journal {journal} has the wrong shape (no list of targets)", tip=tip)
        restored = rollback_changes(txn, entries)
        (reporter or NullReporter()).step(
            "git", f"refresh: rolled back an interrupted refresh of {engine} ({len(restored)} files put back)"
        )
    shutil.rmtree(txn)
    return tuple(restored)


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)
