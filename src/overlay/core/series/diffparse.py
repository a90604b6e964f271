"""The diff of a git format-patch file: its ``diff --git`` sections (git's C-quoted paths, extended headers, modes,
blob ids) and their hunks, as frozen data (:mod:`overlay.core.series.model`).

Strict, as :mod:`overlay.core.series.parse`: a hunk whose line counts do not add up, a binary diff, a symlink or
submodule mode, a path that escapes the tree or reaches into ``.git`` is refused with the file and line named.
"""

from __future__ import annotations

import re

from overlay.core.series.model import FileDiff, FileKind, Hunk, Line
from overlay.errors import ConfigError, IntegrityError
from overlay.fsutil import safe_relpath

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
# a line number or count with more digits is not a real patch (and int() of 5000 digits raises)
_MAX_DIGITS = 9
_BLOB = re.compile(rb"^[0-9a-f]{4,64}$")
_MODE = re.compile(rb"^(100644|100755|120000|160000|040000)$")


def _unquote(path: bytes, where: str, lineno: int) -> str:
    if path.startswith(b'"'):
        if not path.endswith(b'"') or len(path) < 2:
            raise ConfigError(f"{where}:{lineno}: unterminated quoted path {path!r}")
        inner = path[1:-1]
        out = bytearray()
        j = 0
        while j < len(inner):
            c = inner[j]
            if c == 0x5C:  # backslash
                j += 1
                if j >= len(inner):
                    raise ConfigError(f"{where}:{lineno}: bad escape in quoted path {path!r}")
                e = inner[j]
                simple = {
                    ord("n"): 10,
                    ord("t"): 9,
                    ord('"'): 34,
                    ord("\\"): 92,
                    ord("a"): 7,
                    ord("b"): 8,
                    ord("f"): 12,
                    ord("r"): 13,
                    ord("v"): 11,
                }
                if e in simple:
                    out.append(simple[e])
                elif 0x30 <= e <= 0x37:
                    digits = inner[j : j + 3]
                    if not re.fullmatch(rb"[0-7]{3}", digits) or int(digits, 8) > 0o377:
                        raise ConfigError(
                            f"{where}:{lineno}: bad octal escape \\{digits.decode('latin-1')} in quoted path {path!r}"
                        )
                    out.append(int(digits, 8))
                    j += 2
                else:
                    raise ConfigError(f"{where}:{lineno}: bad escape in quoted path {path!r}")
            else:
                out.append(c)
            j += 1
        path = bytes(out)
    try:
        return path.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}:{lineno}: path {path!r} is not UTF-8") from None


def _strip_prefix(path: str, prefix: str, where: str, lineno: int) -> str:
    if not path.startswith(prefix):
        raise ConfigError(f"{where}:{lineno}: path {path!r} lacks the {prefix!r} prefix git writes")
    rel = path[len(prefix) :]
    return _checked(rel, where, lineno)


def _split_git_header(rest: bytes, where: str, lineno: int) -> tuple[str, str]:
    """``diff --git a/X b/Y``: both sides, quoted or not. For unquoted paths with spaces, assume X == Y."""
    if rest.startswith(b'"'):
        end = _closing_quote(rest)
        if end < 0 or rest[end + 1 : end + 2] != b" ":
            raise ConfigError(f"{where}:{lineno}: unterminated quoted path in `diff --git {rest[:80]!r}`")
        a, b = rest[: end + 1], rest[end + 2 :]
        return _unquote(a, where, lineno), _unquote(b, where, lineno)
    if rest.endswith(b'"'):
        start = rest.rfind(b' "')
        if start < 0:
            raise ConfigError(f"{where}:{lineno}: unterminated quoted path in `diff --git {rest[:80]!r}`")
        return _unquote(rest[:start], where, lineno), _unquote(rest[start + 1 :], where, lineno)
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half : half + 1] == b" " and rest[2:half] == rest[half + 3 :]:
        return _unquote(rest[:half], where, lineno), _unquote(rest[half + 1 :], where, lineno)
    parts = rest.split(b" ")
    if len(parts) != 2:
        raise ConfigError(f"{where}:{lineno}: cannot split `diff --git` paths {rest!r}")
    return _unquote(parts[0], where, lineno), _unquote(parts[1], where, lineno)


def _closing_quote(quoted: bytes) -> int:
    """Index of the quote that closes the C-quoted string ``quoted`` starts with (-1 when there is none)."""
    j = 1
    while j < len(quoted):
        c = quoted[j]
        if c == 0x5C:  # backslash: skip the escaped character
            j += 2
            continue
        if c == 0x22:
            return j
        j += 1
    return -1


def parse_diffs(lines: list[bytes], i: int, where: str) -> list[FileDiff]:
    files: list[FileDiff] = []
    n = len(lines)
    while i < n:
        line = lines[i]
        if line == b"-- " or line.startswith(b"base-commit:"):
            break  # signature or trailer of format-patch --base
        if not line.startswith(b"diff --git "):
            if line.strip() == b"":
                i += 1
                continue
            raise ConfigError(f"{where}:{i + 1}: unexpected line outside a diff: {line[:80]!r}")
        header_lineno = i + 1
        a_side, b_side = _split_git_header(line[len(b"diff --git ") :], where, header_lineno)
        old_path: str | None = _strip_prefix(a_side, "a/", where, header_lineno)
        new_path: str | None = _strip_prefix(b_side, "b/", where, header_lineno)
        kind: FileKind = "modify"
        old_mode = new_mode = old_blob = new_blob = None
        i += 1
        while i < n and not lines[i].startswith((b"--- ", b"@@ ", b"diff --git ")):
            h = lines[i]
            lineno = i + 1
            if h.startswith(b"old mode "):
                old_mode = _mode(h[9:], where, lineno)
            elif h.startswith(b"new mode "):
                new_mode = _mode(h[9:], where, lineno)
            elif h.startswith(b"deleted file mode "):
                kind, old_mode = "delete", _mode(h[18:], where, lineno)
            elif h.startswith(b"new file mode "):
                kind, new_mode = "add", _mode(h[14:], where, lineno)
            elif h.startswith(b"rename from "):
                kind, old_path = "rename", _checked(_unquote(h[12:], where, lineno), where, lineno)
            elif h.startswith(b"rename to "):
                new_path = _checked(_unquote(h[10:], where, lineno), where, lineno)
            elif h.startswith(b"copy from "):
                kind, old_path = "copy", _checked(_unquote(h[10:], where, lineno), where, lineno)
            elif h.startswith(b"copy to "):
                new_path = _checked(_unquote(h[8:], where, lineno), where, lineno)
            elif h.startswith((b"similarity index ", b"dissimilarity index ")):
                pass
            elif h.startswith(b"index "):
                spec = h[6:].split(b" ")
                blobs = spec[0].split(b"..")
                if len(blobs) != 2:
                    raise ConfigError(f"{where}:{lineno}: malformed index line {h!r}")
                if not all(_BLOB.match(b) for b in blobs):
                    raise ConfigError(
                        f"{where}:{lineno}: malformed index line {h[:80]!r} (expected hex blob ids)"
                    )
                old_blob, new_blob = blobs[0].decode(), blobs[1].decode()
                if len(spec) > 1:
                    mode = _mode(spec[1], where, lineno)
                    old_mode = old_mode or mode
                    new_mode = new_mode or mode
            elif h.startswith((b"Binary files ", b"GIT binary patch")):
                raise ConfigError(
                    f"{where}:{lineno}: binary diffs are not supported ({(old_path or new_path)!r})",
                    tip="ship binary changes as a build step, not a patch",
                )
            else:
                raise ConfigError(f"{where}:{lineno}: unexpected extended header line {h[:80]!r}")
            i += 1
        for mode_ in (old_mode, new_mode):
            if mode_ == "120000":
                raise IntegrityError(
                    f"{where}:{header_lineno}: {(new_path or old_path)!r} is a symlink; patches may not create or change symlinks"
                )
            if mode_ in ("160000", "040000"):
                raise ConfigError(
                    f"{where}:{header_lineno}: {(new_path or old_path)!r} has mode {mode_} (submodule/tree); not supported"
                )
        if kind == "add":
            old_path = None
        elif kind == "delete":
            new_path = None
        hunks: list[Hunk] = []
        if i < n and lines[i].startswith(b"--- "):
            minus, plus = lines[i][4:], lines[i + 1][4:] if i + 1 < n else b""
            if i + 1 >= n or not lines[i + 1].startswith(b"+++ "):
                raise ConfigError(f"{where}:{i + 2}: `---` line not followed by `+++`")
            _check_side(minus, old_path, "a/", where, i + 1)
            _check_side(plus, new_path, "b/", where, i + 2)
            i += 2
            while i < n and lines[i].startswith(b"@@"):
                hunk, i = _parse_hunk(lines, i, where)
                hunks.append(hunk)
        if kind == "modify" and not hunks and old_mode == new_mode:
            raise ConfigError(
                f"{where}:{header_lineno}: diff for {old_path!r} has no hunks and no mode change"
            )
        _check_hunk_order(hunks, where)
        files.append(
            FileDiff(
                kind=kind,
                old_path=old_path,
                new_path=new_path,
                old_mode=old_mode,
                new_mode=new_mode,
                old_blob=old_blob,
                new_blob=new_blob,
                hunks=tuple(hunks),
            )
        )
    return files


def _checked(path: str, where: str, lineno: int) -> str:
    rel = safe_relpath(path, what=f"{where}:{lineno}: patch path")
    if ".git" in rel.parts:
        raise IntegrityError(f"{where}:{lineno}: patch path {path!r} reaches into a .git folder; refusing it")
    return path


def _mode(raw: bytes, where: str, lineno: int) -> str:
    raw = raw.strip()
    if not _MODE.match(raw):
        raise ConfigError(f"{where}:{lineno}: unknown file mode {raw!r}")
    return raw.decode()


def _check_side(raw: bytes, expected: str | None, prefix: str, where: str, lineno: int) -> None:
    side = raw.split(b"\t", 1)[0]
    if side == b"/dev/null":
        if expected is not None:
            raise ConfigError(f"{where}:{lineno}: /dev/null where the diff header names {expected!r}")
        return
    path = _strip_prefix(_unquote(side, where, lineno), prefix, where, lineno)
    if expected is None or path != expected:
        raise ConfigError(f"{where}:{lineno}: path {path!r} disagrees with the diff header ({expected!r})")


def _parse_hunk(lines: list[bytes], i: int, where: str) -> tuple[Hunk, int]:
    header_line = i + 1
    m = _HUNK.match(lines[i])
    if not m:
        raise ConfigError(f"{where}:{header_line}: malformed hunk header {lines[i][:80]!r}")
    if any(g is not None and len(g) > _MAX_DIGITS for g in m.groups()[:4]):
        raise ConfigError(
            f"{where}:{header_line}: hunk header {lines[i][:80]!r} has a line number or count of more than "
            f"{_MAX_DIGITS} digits",
            tip="the patch is damaged; re-export it with `git format-patch`",
        )
    old_start, new_start = int(m.group(1)), int(m.group(3))
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    section = m.group(5).decode("utf-8", "replace").strip()
    i += 1
    body: list[Line] = []
    seen_old = seen_new = 0
    while i < len(lines) and (seen_old < old_len or seen_new < new_len):
        raw = lines[i]
        op = raw[:1]
        if op == b"\\":
            _drop_newline(body, where, i + 1)
            i += 1
            continue
        if op == b"" and raw == b"":
            op, raw = b" ", b" "  # some tools strip the space of an empty context line
        if op not in (b" ", b"-", b"+"):
            raise ConfigError(
                f"{where}:{i + 1}: hunk at line {header_line} ends early: expected {old_len} old/{new_len} new lines, "
                f"got {seen_old}/{seen_new} before {raw[:60]!r}"
            )
        body.append(Line(op=op.decode(), text=raw[1:] + b"\n"))
        if op != b"+":
            seen_old += 1
        if op != b"-":
            seen_new += 1
        i += 1
    if seen_old != old_len or seen_new != new_len:
        raise ConfigError(
            f"{where}:{header_line}: hunk says -{old_len} +{new_len} lines but has -{seen_old} +{seen_new} (truncated patch?)"
        )
    if i < len(lines) and lines[i][:1] == b"\\":
        _drop_newline(body, where, i + 1)
        i += 1
    if (old_len == 0 and old_start < 0) or (old_len > 0 and old_start < 1):
        raise ConfigError(f"{where}:{header_line}: hunk starts at line {old_start}")
    return (
        Hunk(
            old_start=old_start,
            old_len=old_len,
            new_start=new_start,
            new_len=new_len,
            section=section,
            lines=tuple(body),
            header_line=header_line,
        ),
        i,
    )


def _drop_newline(body: list[Line], where: str, lineno: int) -> None:
    if not body:
        raise ConfigError(f"{where}:{lineno}: `\\ No newline at end of file` with no line before it")
    last = body[-1]
    body[-1] = Line(op=last.op, text=last.text[:-1])


def _check_hunk_order(hunks: list[Hunk], where: str) -> None:
    end = 0
    for h in hunks:
        start = h.old_start if h.old_len else h.old_start + 1
        if start < end:
            raise ConfigError(
                f"{where}:{h.header_line}: hunk overlaps or precedes the previous one (old line {h.old_start})"
            )
        end = h.old_start + h.old_len
