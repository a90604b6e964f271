"""Probe helper: build a folder of test models once, atomically, under a file lock (parallel tests share it)."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(root: Path, name: str, make: Callable[[Path], None]) -> Path:
    """Return ``root/name``, first calling ``make(scratch)`` to fill a scratch folder that then replaces it; a folder
    without its ``models.json`` (a killed build) is rebuilt. ``make`` must write ``models.json`` last."""
    final = root / name
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "models.json").is_file():
            shutil.rmtree(final, ignore_errors=True)
            scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
            try:
                make(scratch)
                os.replace(scratch, final)
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
    return final
