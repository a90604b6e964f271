"""git format-patch files parsed into frozen data (:mod:`overlay.core.series.model`).

A patch file is kept as bytes (``Patch.raw``); everything else is derived from it. Parsing is strict: anything we
would have to guess about (a hunk whose line counts do not add up, a binary diff, a symlink, a path that escapes the
tree) is refused with the file and line named. The message (headers, subject, body, trailers) is read here, the diff
in :mod:`overlay.core.series.diffparse`.
"""

from __future__ import annotations

import email.errors
import email.header
import re
from pathlib import Path

from overlay.core.inputs import read_inside
from overlay.core.series.diffparse import parse_diffs
from overlay.core.series.model import Patch
from overlay.errors import ConfigError

_SUBJECT_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s*(.*)$")


def parse_patch(path: Path, *, root: Path | None = None) -> Patch:
    """Parse one patch file, read without following a symlink out of ``root`` (default: its folder)."""
    try:
        raw = read_inside(path.parent if root is None else root, path, what="patch file")
    except FileNotFoundError:
        raise ConfigError(f"patch {path} does not exist") from None
    return parse_patch_bytes(raw, name=path.name, where=str(path))


def parse_patch_bytes(raw: bytes, *, name: str, where: str | None = None) -> Patch:
    where = where or name
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines or not lines[0].startswith(b"From "):
        raise ConfigError(f"{where}:1: not a git format-patch file (expected a `From <commit> <date>` line)")
    headers: dict[str, str] = {}
    i = 1
    last: str | None = None
    while i < len(lines) and lines[i] != b"":
        text = _decode(lines[i], where, i + 1)
        if text[:1] in (" ", "\t") and last is not None:
            headers[last] += " " + text.strip()
        else:
            key, sep, value = text.partition(":")
            if not sep:
                raise ConfigError(f"{where}:{i + 1}: malformed mail header {text!r}")
            last = key.strip().lower()
            headers[last] = value.strip()
        i += 1
    for key in ("from", "subject"):
        if key not in headers:
            raise ConfigError(f"{where}: missing the {key.capitalize()}: header")
    subject = _SUBJECT_PREFIX.sub("", _decode_header(headers["subject"], where, "Subject"))
    i += 1  # blank line
    body_lines: list[str] = []
    while i < len(lines) and lines[i] != b"---" and not lines[i].startswith(b"diff --git "):
        body_lines.append(_decode(lines[i], where, i + 1))
        i += 1
    if i >= len(lines):
        raise ConfigError(f"{where}: no `---` separator and no diff: the patch changes nothing")
    while body_lines and not body_lines[-1].strip():
        body_lines.pop()
    body = "\n".join(body_lines)
    trailers = _parse_trailers(body_lines)
    # skip the diffstat
    while i < len(lines) and not lines[i].startswith(b"diff --git "):
        i += 1
    files = parse_diffs(lines, i, where)
    if not files:
        raise ConfigError(f"{where}: contains no `diff --git` section")
    return Patch(
        name=name,
        raw=raw,
        author=_decode_header(headers["from"], where, "From"),
        date=headers.get("date", ""),
        subject=subject,
        body=body,
        trailers=trailers,
        files=tuple(files),
    )


def _decode(line: bytes, where: str, lineno: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}:{lineno}: the message is not UTF-8") from None


def _decode_header(value: str, where: str = "patch", header: str = "header") -> str:
    """A mail header with RFC 2047 encoded words (``=?utf-8?q?...?=``) decoded; an unknown charset or an encoded word
    that does not decode is a ConfigError naming the header."""
    try:
        parts = email.header.decode_header(value)
        out = []
        for text, charset in parts:
            out.append(text.decode(charset or "utf-8") if isinstance(text, bytes) else text)
    except LookupError as exc:  # an unknown charset (`=?x-unknown?q?...?=`)
        raise ConfigError(
            f"{where}: the {header}: header {value[:80]!r} uses an unknown charset ({exc})",
            tip="re-export the patch with `git format-patch` (it writes UTF-8 encoded words)",
        ) from None
    except (UnicodeError, ValueError, email.errors.HeaderParseError) as exc:
        raise ConfigError(
            f"{where}: the {header}: header {value[:80]!r} does not decode ({exc})",
            tip="re-export the patch with `git format-patch` (it writes UTF-8 encoded words)",
        ) from None
    return "".join(out).strip()


def _parse_trailers(body_lines: list[str]) -> tuple[tuple[str, str], ...]:
    """Trailers are the ``Key: value`` lines of the message's last paragraph (continuations indented)."""
    end = len(body_lines)
    start = end
    while start > 0 and body_lines[start - 1].strip():
        start -= 1
    block = body_lines[start:end]
    out: list[list[str]] = []
    for line in block:
        if line[:1] in (" ", "\t") and out:
            out[-1][1] += " " + line.strip()
            continue
        m = _TRAILER.match(line)
        if not m:
            return ()  # the last paragraph is prose, not trailers
        out.append([m.group(1), m.group(2).strip()])
    return tuple((k, v) for k, v in out)
