"""`overlay rebase`: the series moved onto another release (:mod:`.run`: start, continue, skip, abort, status),
its state and report (:mod:`.state`), publishing and undo (:mod:`.publishing`). The names below are the interface."""

from overlay.upstream.rebase.publishing import edited_manifest, publish, undo
from overlay.upstream.rebase.run import abort, rebase, resume, review_reasons, status
from overlay.upstream.rebase.state import (
    STATE_FILE,
    AbortResult,
    RebaseResult,
    UndoResult,
    history_dir,
    report_json,
    report_path,
    state_dir,
)

__all__ = [
    "STATE_FILE",
    "AbortResult",
    "RebaseResult",
    "UndoResult",
    "abort",
    "edited_manifest",
    "history_dir",
    "publish",
    "rebase",
    "report_json",
    "report_path",
    "resume",
    "review_reasons",
    "state_dir",
    "status",
    "undo",
]
