"""One lock per engine, held by every command that changes its series, worktree or rebase state."""

from __future__ import annotations

import contextlib
from pathlib import Path

from overlay.fsutil import LockHolder, exclusive_lock
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter


def lock_path(root: Path, engine: str) -> Path:
    return layout(root).locks / f"{engine}.lock"


def engine_lock(
    root: Path, engine: str, *, command: str, wait: float = 0.0, reporter: Reporter | None = None
) -> contextlib.AbstractContextManager[None]:
    """The one lock per engine that ``checkout``, ``refresh`` and ``rebase`` hold while they change its series, worktree
    or rebase state (``build/locks/ENGINE.lock``): a second run fails at once naming the holder, or waits ``wait`` s."""
    rep = reporter or NullReporter()

    def waiting(holder: LockHolder) -> None:
        rep.step("lock", f"{engine} is locked by {holder.describe()}; waiting up to {wait:g} s")

    return exclusive_lock(lock_path(root, engine), command=command, wait=wait, on_wait=waiting)
