"""File-system helpers: atomic writes, safe relative paths, scratch directories that never outlive a failure."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from overlay.errors import IntegrityError

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file next to ``path`` and ``os.replace`` it in: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def safe_relpath(name: str, *, what: str) -> PurePosixPath:
    """Validate a path that must stay inside a tree: relative, no ``..``, no empty or ``.`` parts, no backslashes.

    Raises IntegrityError naming ``what`` (e.g. "wheel member", "patch path") and the offending value.
    """
    if not name or "\x00" in name:
        raise IntegrityError(f"{what} {name!r} is empty or contains NUL; refusing it")
    if "\\" in name:
        raise IntegrityError(f"{what} {name!r} contains a backslash; refusing a path that may escape the tree")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise IntegrityError(f"{what} {name!r} is absolute; only paths inside the tree are allowed")
    parts = name.split("/")
    if any(p == ".." for p in parts):
        raise IntegrityError(f"{what} {name!r} contains '..' and would escape the tree")
    cleaned = [p for p in parts if p not in ("", ".")]
    if not cleaned:
        raise IntegrityError(f"{what} {name!r} names no file")
    return PurePosixPath(*cleaned)


def resolve_inside(root: Path, rel: PurePosixPath, *, what: str) -> Path:
    """Join ``rel`` under ``root`` and refuse it if any existing component is a symlink (it could leave the tree)."""
    current = root
    for part in rel.parts:
        current = current / part
        if current.is_symlink():
            raise IntegrityError(
                f"{what} {str(rel)!r} goes through the symlink {current.relative_to(root)!s}; refusing to follow it"
            )
    return current


@contextlib.contextmanager
def scratch_dir(parent: Path, prefix: str) -> Iterator[Path]:
    """A temp directory under ``parent`` that is removed on exit, success or not."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def clean_stale_scratch(parent: Path) -> int:
    """Remove scratch directories left by a killed run. Returns how many were removed.

    Scratch directories carry the pid of their owner in a ``.owner`` file; one whose owner is gone is stale.
    """
    if not parent.is_dir():
        return 0
    removed = 0
    for child in parent.iterdir():
        owner = child / ".owner"
        pid = None
        with contextlib.suppress(OSError, ValueError):
            pid = int(owner.read_text().strip())
        if pid is not None and _pid_alive(pid):
            continue
        shutil.rmtree(child, ignore_errors=True)
        removed += 1
    return removed


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) on ``path``, held for the ``with`` block: parallel processes building the same
    cached thing (a venv, a model) wait for each other instead of racing."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def owned_scratch(parent: Path, prefix: str) -> Iterator[Path]:
    """Like :func:`scratch_dir`, but marks the directory with our pid so a later run can clean it if we are killed."""
    clean_stale_scratch(parent)
    with scratch_dir(parent, prefix) as path:
        (path / ".owner").write_text(str(os.getpid()))
        yield path


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
