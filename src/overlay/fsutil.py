"""File-system helpers: atomic writes (umask honoured, modes kept, any file system), safe relative paths, scratch
directories owned from the moment they exist, per-engine locks, JSON state files read with their path in every error."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from overlay.errors import ConfigError, IntegrityError, UsageError

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ensure_dir(path: Path) -> Path:
    """``mkdir -p path``; a file where the folder or one above it should be is a ConfigError naming that file (a
    ``build`` file in the repository, a ``--out`` below a file) instead of an unexpected NotADirectoryError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise ConfigError(
            f"cannot create the folder {path}: {blocker} is not a folder ({exc.strerror})",
            tip=f"move {blocker} away, or point the tool elsewhere (--out, --root)",
        ) from None
    return path


def current_umask() -> int:
    """The process umask, read without changing it where the platform allows.

    Linux reports it in ``/proc/self/status``; elsewhere it is read by setting it and putting it back (two
    ``os.umask`` calls). That fallback is not thread-safe: a file another thread creates between the two calls gets the
    temporary umask 0o077 (a stricter mode, never a looser one). The tool itself writes files from one thread only.
    """
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def new_file_mode(path: Path | None = None, *, executable: bool = False) -> int:
    """The mode a file written at ``path`` gets: an existing file keeps its own (executables stay executable); a new one
    gets 0o666 (0o777 when ``executable``) less the umask, like ``open()`` or any other tool would give it."""
    if path is not None:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            st = path.stat()
            if stat.S_ISREG(st.st_mode):
                return stat.S_IMODE(st.st_mode)
    return (0o777 if executable else 0o666) & ~current_umask()


def temp_path_for(path: Path) -> Path:
    """A fresh temp name in ``path``'s own folder (hidden, ``.tmp``): a rename from there never crosses a device."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to a temp file next to ``path`` and ``os.replace`` it in: readers never see half a file.

    The file gets ``mode`` when given, else the mode of the file it replaces, else 0o666 less the umask.
    """
    ensure_dir(path.parent)
    final_mode = new_file_mode(path) if mode is None else mode
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), final_mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _renamed(src: Path, dest: Path) -> bool:
    """``os.replace(src, dest)``; False (nothing moved) when the two are on different devices, so the caller copies."""
    try:
        os.replace(src, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        return False
    return True


def publish_file(src: Path, dest: Path) -> None:
    """Move the finished file ``src`` (made in a scratch folder) to ``dest``, atomically, on any file system.

    ``dest`` keeps its mode when it exists (``src``'s mode otherwise). When ``src`` is on another device (``--out``
    on a tmpfs, ``/dev/shm``), it is first copied to a temp name in ``dest``'s folder, then renamed: a reader of
    ``dest`` never sees half a file, and a failure leaves no temp file behind.
    """
    ensure_dir(dest.parent)
    mode = new_file_mode(dest) if dest.is_file() else stat.S_IMODE(src.stat().st_mode)
    os.chmod(src, mode)
    if _renamed(src, dest):
        return
    tmp = temp_path_for(dest)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, mode)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    src.unlink()


def publish_dir(src: Path, dest: Path) -> None:
    """Move the finished folder ``src`` to ``dest`` (which must not exist), copying through a temp sibling of ``dest``
    when the two are on different devices."""
    ensure_dir(dest.parent)
    if _renamed(src, dest):
        return
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        os.rmdir(tmp)
        shutil.copytree(src, tmp, symlinks=True)
        os.chmod(tmp, stat.S_IMODE(src.stat().st_mode))
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(src)


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
        raise IntegrityError(
            f"{what} {name!r} contains a backslash; refusing a path that may escape the tree"
        )
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


#: scratch folder names end in ``-<pid>-<random>``: the owner is known from the moment the folder exists
_SCRATCH_NAME = re.compile(r"-(\d+)-[A-Za-z0-9_]+$")


def make_scratch(parent: Path, prefix: str) -> Path:
    """``mkdtemp`` under ``parent`` with our pid in the name (``PREFIX-PID-XXXX``).

    A file where ``parent`` or one of its folders should be is a ConfigError naming it (:func:`ensure_dir`)."""
    ensure_dir(parent)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir=parent))


@contextlib.contextmanager
def scratch_dir(parent: Path, prefix: str) -> Iterator[Path]:
    """A temp directory under ``parent`` (named ``PREFIX-PID-XXXX``) that is removed on exit, success or not."""
    path = make_scratch(parent, prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def scratch_owner(path: Path) -> int | None:
    """The pid that owns a scratch folder: from its name (``PREFIX-PID-XXXX``), else from an older ``.owner`` file."""
    match = _SCRATCH_NAME.search(path.name)
    if match:
        return int(match.group(1))
    with contextlib.suppress(OSError, ValueError):
        return int((path / ".owner").read_text().strip())
    return None


def clean_stale_scratch(parent: Path) -> int:
    """Remove scratch directories left by a killed run. Returns how many were removed.

    A scratch directory names its owner's pid (``PREFIX-PID-XXXX``, see :func:`make_scratch`; older ones carry a
    ``.owner`` file); one whose owner is gone is stale. A folder that names no owner is stale too. Because the pid is
    in the name given at ``mkdtemp`` time, a concurrent cleaner never removes a live run's folder, however young.
    """
    if not parent.is_dir():
        return 0
    removed = 0
    for child in parent.iterdir():
        if not child.is_dir() or child.is_symlink():
            continue
        pid = scratch_owner(child)
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

    ensure_dir(path.parent)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass(frozen=True)
class LockHolder:
    """What a lock file records about the run holding it."""

    pid: int | None
    command: str
    started: float | None

    def describe(self) -> str:
        since = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
            if self.started
            else "an unknown time"
        )
        pid = f"pid {self.pid}" if self.pid is not None else "an unknown process"
        return f"{pid} (`{self.command or '?'}`, since {since})"


def read_lock_holder(path: Path) -> LockHolder:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return LockHolder(
            pid=int(data["pid"]), command=str(data.get("command", "")), started=float(data["started"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return LockHolder(pid=None, command="", started=None)


@contextlib.contextmanager
def exclusive_lock(
    path: Path,
    *,
    command: str,
    wait: float = 0.0,
    on_wait: Callable[[LockHolder], None] | None = None,
    poll: float = 0.1,
) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the ``with`` block, recording our pid, ``command`` and start time in it.

    Non-blocking first. When another process holds it: with ``wait == 0`` raise UsageError naming the holder; else call
    ``on_wait(holder)`` once and retry until ``wait`` seconds have passed (then raise the same error). The lock dies with
    its process (a killed run never leaves it held); the file itself stays, emptied on release.
    """
    import fcntl

    ensure_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + max(wait, 0.0)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = read_lock_holder(path)
                if time.monotonic() >= deadline:
                    waited = f" (waited {wait:g} s)" if wait > 0 else ""
                    raise UsageError(
                        f"{command}: another overlay run holds {path}{waited}: {holder.describe()}",
                        tip="wait for it to finish, or pass --wait SECONDS to wait for it; the lock is released when "
                        "that process exits (a killed run never leaves it held)",
                    ) from None
                if not told and on_wait is not None:
                    on_wait(holder)
                    told = True
                time.sleep(poll)
        info = (
            json.dumps({"version": 1, "pid": os.getpid(), "command": command, "started": time.time()}) + "\n"
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode("utf-8"), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def owned_scratch(parent: Path, prefix: str) -> Iterator[Path]:
    """Like :func:`scratch_dir`, after removing the stale scratch folders of killed runs from ``parent``."""
    clean_stale_scratch(parent)
    with scratch_dir(parent, prefix) as path:
        yield path


def read_json_state(path: Path, *, what: str, tip: str) -> Any:
    """Parse the JSON state file ``path``; a truncated or non-JSON one is a ConfigError naming it (and ``tip``)."""
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory, not a JSON file", tip=tip) from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (byte {exc.start}); it is corrupt", tip=tip
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{what} {path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            "it is truncated or corrupt",
            tip=tip,
        ) from None


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True
