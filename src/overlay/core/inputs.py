"""Reading the overlay repository's inputs: names that never become paths unchecked, files never read through a link
that leaves the root.

The overlay repository is trusted, but only inside itself (docs/security.md):

- :func:`check_name` validates a name that becomes one path component (an engine on the command line, an artifact
  file name, a patch name from ``series``): not empty, no ``/`` or ``\\``, no ``..``, no leading ``-``, no NUL or
  other control character. A bad one is a ConfigError or UsageError (exit 2) naming the value.
- :func:`check_relative` validates a manifest field that names a folder inside the root (``series.dir``,
  ``runtime.python-path``): relative, no ``..``, no backslash, no NUL.
- :func:`inside_root` resolves a path (every symlink on the way) and refuses it with IntegrityError (exit 5), naming
  the path and where it leads, when the result is outside the root. A symlink that stays inside the root is allowed
  (``patches/a`` may link to ``patches/shared``); one that leaves it is never followed.
- :func:`read_inside` is the one way manifests, ``series`` and patch files are read: :func:`inside_root`, then the
  resolved file is opened with ``O_NOFOLLOW`` (a link swapped in after the check is not followed either) and must be
  a regular file.
"""

from __future__ import annotations

import difflib
import errno
import os
import stat
from pathlib import Path

from overlay.errors import ConfigError, IntegrityError, OverlayError

_CONTROL = frozenset(chr(c) for c in range(32)) | {"\x7f"}


def check_name(value: str, *, what: str, error: type[OverlayError] = ConfigError, where: str = "") -> str:
    """``value`` if it is safe as one path component; else ``error`` naming ``what`` and the value.

    ``where`` (a file, ``file:line``) prefixes the message when given.
    """
    problem = None
    if not value:
        problem = "is empty"
    elif any(ch in _CONTROL for ch in value):
        problem = "contains a NUL or another control character"
    elif "/" in value or "\\" in value:
        problem = "contains a path separator ('/' or '\\')"
    elif ".." in value:
        problem = "contains '..'"
    elif value.startswith("-"):
        problem = "begins with '-' (it would read as an option)"
    elif value == ".":
        problem = "is '.'"
    if problem is None:
        return value
    prefix = f"{where}: " if where else ""
    raise error(
        f"{prefix}{what} {value!r} {problem}; a name here becomes a file or folder name and must be one plain component",
        tip="use the name as it is spelled in overlays/ or patches/ (letters, digits, '.', '_', '-')",
    )


def check_relative(value: str, *, what: str, where: str) -> str:
    """``value`` (a folder inside the root, '/'-separated) if it is relative and stays inside; else ConfigError."""
    problem = None
    if not value.strip("/"):
        problem = "is empty"
    elif any(ch in _CONTROL for ch in value):
        problem = "contains a NUL or another control character"
    elif "\\" in value:
        problem = "contains a backslash"
    elif value.startswith("/") or (len(value) > 1 and value[1] == ":"):
        problem = "is absolute"
    elif ".." in value.split("/"):
        problem = "contains '..'"
    if problem is None:
        return value
    raise ConfigError(
        f"{where}: {what} {value!r} {problem}; it must name a folder inside the overlay repository",
        tip='write it relative to the repository root, e.g. "patches/ENGINE"',
    )


def inside_root(root: Path, path: Path, *, what: str) -> Path:
    """The real location of ``path`` (symlinks resolved); IntegrityError when it is outside ``root``'s real location."""
    real_root = root.resolve()
    real = path.resolve()
    if real == real_root or real.is_relative_to(real_root):
        return real
    link = _first_link(path)
    via = f" (through the symlink {link} -> {os.readlink(link)})" if link is not None else ""
    raise IntegrityError(
        f"{what} {path} leads to {real}{via}, outside the overlay repository {real_root}; refusing to follow it",
        tip="replace the symlink with the file itself (or a link that stays inside the repository)",
    )


def _first_link(path: Path) -> Path | None:
    """The first component of ``path`` that is a symlink (None when there is none)."""
    current = Path(path.anchor) if path.is_absolute() else Path()
    for part in path.parts[1:] if path.is_absolute() else path.parts:
        current = current / part
        if current.is_symlink():
            return current
    return None


def decode_utf8(data: bytes, path: Path, *, tip: str) -> str:
    """``data`` (the bytes of ``path``) as UTF-8; else a ConfigError naming ``path:LINE`` and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 (byte {data[exc.start]:#04x})", tip=tip) from None


def read_inside(root: Path, path: Path, *, what: str) -> bytes:
    """The bytes of the regular file ``path``, which must resolve inside ``root`` (see the module docstring).

    FileNotFoundError propagates (the caller says what is missing and how to make it).
    """
    real = inside_root(root, path, what=what)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        if exc.errno == errno.ELOOP:
            raise IntegrityError(
                f"{what} {path} became a symlink while it was read; refusing to follow it"
            ) from None
        raise ConfigError(
            f"{what} {path} cannot be read: {exc.strerror}", tip="check its permissions"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ConfigError(
                f"{what} {path} is {kind}; expected a file", tip="replace it with the file it should be"
            )
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def closest(key: str, known: list[str]) -> str:
    """A " (did you mean ...?)" suffix for an unknown key, or the list of known ones."""
    match = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else f" (known keys: {', '.join(known)})"
