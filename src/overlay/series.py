"""The series folder and its git format-patch files, parsed into frozen data.

A patch file is kept as bytes (``Patch.raw``); everything else is derived from it. Parsing is strict: anything we
would have to guess about (a hunk whose line counts do not add up, a binary diff, a symlink, a path that escapes the
tree) is refused with the file and line named.
"""

from __future__ import annotations

import email.errors
import email.header
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from overlay.errors import ConfigError, IntegrityError
from overlay.fsutil import safe_relpath
from overlay.inputs import check_name, decode_utf8, inside_root, read_inside

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from overlay.mechanism import Flag, Mechanism

THEMES = (
    "cuda-graph",
    "h2d-sync",
    "allreduce-fusion",
    "sampling-fusion",
    "lm-head",
    "kernel-injection",
    "drafter-kv",
    "mtp",
    "spec-decoding",
    "dispatch-fusion",
    "loading",
    "platform",
    "observability",
    "other",
)
NUMERICS = ("exact", "lossless", "approximate")
UPSTREAM_STATUS = ("Pending", "Submitted", "Backport", "Inappropriate")
REQUIRED_TRAILERS = ("Overlay-Theme", "Overlay-Numerics", "Overlay-Check", "Upstream-Status")

Numerics = Literal["exact", "lossless", "approximate"]
FileKind = Literal["modify", "add", "delete", "rename", "copy"]

_PATCH_NAME = re.compile(r"^(\d{4})-[A-Za-z0-9][A-Za-z0-9._-]*\.patch$")
_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_MAX_DIGITS = 9  # a line number or count with more digits is not a real patch (and int() of 5000 digits raises)
_BLOB = re.compile(rb"^[0-9a-f]{4,64}$")
_SUBJECT_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s*(.*)$")
_MODE = re.compile(rb"^(100644|100755|120000|160000|040000)$")


@dataclass(frozen=True)
class Line:
    """One hunk line: ``op`` is ' ', '-' or '+'; ``text`` includes the line ending unless ``eol`` is False."""

    op: str
    text: bytes


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str
    lines: tuple[Line, ...]
    header_line: int  # 1-based line of the @@ header in the patch file

    @property
    def old_lines(self) -> tuple[bytes, ...]:
        return tuple(line.text for line in self.lines if line.op != "+")

    @property
    def new_lines(self) -> tuple[bytes, ...]:
        return tuple(line.text for line in self.lines if line.op != "-")


@dataclass(frozen=True)
class FileDiff:
    kind: FileKind
    old_path: str | None  # repo-root relative, None for a new file
    new_path: str | None  # None for a deleted file
    old_mode: str | None
    new_mode: str | None
    old_blob: str | None
    new_blob: str | None
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        """The path this diff leaves behind (or removes)."""
        return self.new_path if self.new_path is not None else (self.old_path or "")

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in dict.fromkeys((self.old_path, self.new_path)) if p is not None)


@dataclass(frozen=True)
class Patch:
    name: str
    raw: bytes
    author: str
    date: str
    subject: str
    body: str  # message after the subject, trailers included
    trailers: tuple[tuple[str, str], ...]
    files: tuple[FileDiff, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def number(self) -> int:
        m = _PATCH_NAME.match(self.name)
        return int(m.group(1)) if m else 0

    def trailer(self, key: str) -> str | None:
        for k, v in self.trailers:
            if k.lower() == key.lower():
                return v
        return None

    @property
    def theme(self) -> str | None:
        return self.trailer("Overlay-Theme")

    @property
    def numerics(self) -> str | None:
        return self.trailer("Overlay-Numerics")

    @property
    def check(self) -> str | None:
        return self.trailer("Overlay-Check")

    @property
    def upstream_status(self) -> str | None:
        return self.trailer("Upstream-Status")

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for f in self.files for p in f.paths))

    def trailer_values(self, key: str) -> tuple[str, ...]:
        """Every value of a trailer that may repeat (``Overlay-Mechanism``, ``Overlay-Requires``), in message order."""
        return tuple(v for k, v in self.trailers if k.lower() == key.lower())

    @property
    def flags(self) -> tuple[Flag, ...]:
        """The parsed ``Overlay-Flag`` values (raises ConfigError on a malformed one; `overlay lint` reports it)."""
        from overlay.mechanism import parse_flag

        return tuple(parse_flag(v) for v in self.trailer_values("Overlay-Flag"))

    @property
    def mechanisms(self) -> tuple[Mechanism, ...]:
        """The parsed ``Overlay-Mechanism`` lines (scenario names checked against every engine's census)."""
        from overlay.mechanism import parse_mechanism

        return tuple(parse_mechanism(v) for v in self.trailer_values("Overlay-Mechanism"))

    @property
    def requires(self) -> tuple[str, ...]:
        """The patch file names ``Overlay-Requires`` lists (earlier patches of the same series)."""
        return tuple(name for v in self.trailer_values("Overlay-Requires") for name in v.split())


@dataclass(frozen=True)
class Series:
    engine: str
    base_version: str
    base_commit: str | None
    patches: tuple[Patch, ...]
    path: Path

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.patches)

    def prefix(self, upto: int | None) -> tuple[Patch, ...]:
        return self.patches if upto is None else self.patches[:upto]


def series_hash(patches: tuple[Patch, ...] | list[Patch]) -> str:
    """sha256 over the applied patch files' bytes, concatenated in series order (DESIGN: HASH8 = first 8 hex)."""
    digest = hashlib.sha256()
    for patch in patches:
        digest.update(patch.raw)
    return digest.hexdigest()


# ---------------------------------------------------------------- series file


@dataclass(frozen=True)
class SeriesFile:
    engine: str
    base_version: str
    base_commit: str | None
    names: tuple[str, ...]


def parse_series_file(path: Path, *, root: Path | None = None) -> SeriesFile:
    """Parse a ``series`` file, read without following a symlink out of ``root`` (default: its folder)."""
    try:
        data = read_inside(path.parent if root is None else root, path, what="series file")
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist", tip="create it with `# base: ENGINE VERSION COMMIT` as its first line"
        ) from None
    text = decode_utf8(data, path, tip="patch file names are ASCII; save series as UTF-8")
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# base:"):
        raise ConfigError(f"{path}:1: the first line must be `# base: ENGINE VERSION COMMIT`, got {lines[:1]!r}")
    fields = lines[0][len("# base:") :].split()
    if len(fields) != 3:
        raise ConfigError(f"{path}:1: `# base:` needs ENGINE VERSION COMMIT (COMMIT may be '-'), got {fields!r}")
    engine, version, commit = fields
    if commit != "-" and not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ConfigError(f"{path}:1: base commit {commit!r} is neither '-' nor a 40-hex commit id")
    names: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if " " in entry or "\t" in entry:
            raise ConfigError(f"{path}:{lineno}: one patch file name per line, got {entry!r} (options are not supported)")
        check_name(entry, what="patch name", where=f"{path}:{lineno}")
        if not _PATCH_NAME.match(entry):
            raise ConfigError(f"{path}:{lineno}: {entry!r} is not a patch file name of the form NNNN-slug.patch")
        if entry in seen:
            raise ConfigError(f"{path}:{lineno}: {entry!r} is listed twice (first on line {seen[entry]})")
        seen[entry] = lineno
        names.append(entry)
    return SeriesFile(engine=engine, base_version=version, base_commit=None if commit == "-" else commit, names=tuple(names))


def load_series(series_dir: Path, *, check_folder: bool = True, root: Path | None = None) -> Series:
    """Parse ``series`` and every patch it names; with ``check_folder``, refuse patch files it does not name.

    The folder, ``series`` and every patch file must resolve inside ``root`` (default: the folder itself): a symlink
    that leads out is refused with IntegrityError (:mod:`overlay.inputs`).
    """
    root = series_dir if root is None else root
    inside_root(root, series_dir, what="series folder")
    sf = parse_series_file(series_dir / "series", root=root)
    if check_folder:
        on_disk = {p.name for p in series_dir.glob("*.patch")}
        missing = [n for n in sf.names if n not in on_disk]
        if missing:
            raise ConfigError(
                f"{series_dir}/series names {missing[0]!r}, but there is no such file"
                + (f" ({len(missing)} missing)" if len(missing) > 1 else ""),
                tip="restore the file or remove its line from series",
            )
        extra = sorted(on_disk - set(sf.names))
        if extra:
            raise ConfigError(
                f"{series_dir}/{extra[0]} is not listed in series" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""),
                tip="add it to series in its place, or delete it",
            )
        numbers: dict[str, str] = {}
        for n in sf.names:
            num = n[:4]
            if num in numbers:
                raise ConfigError(f"{series_dir}: {n!r} and {numbers[num]!r} share the number {num}", tip="run `overlay refresh` to renumber")
            numbers[num] = n
    patches = tuple(parse_patch(series_dir / n, root=root) for n in sf.names)
    return Series(
        engine=sf.engine,
        base_version=sf.base_version,
        base_commit=sf.base_commit,
        patches=patches,
        path=series_dir,
    )


# ---------------------------------------------------------------- patch files


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
    files = _parse_diffs(lines, i, where)
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
                simple = {ord("n"): 10, ord("t"): 9, ord('"'): 34, ord("\\"): 92, ord("a"): 7, ord("b"): 8, ord("f"): 12, ord("r"): 13, ord("v"): 11}
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


def _parse_diffs(lines: list[bytes], i: int, where: str) -> list[FileDiff]:
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
                    raise ConfigError(f"{where}:{lineno}: malformed index line {h[:80]!r} (expected hex blob ids)")
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
                raise IntegrityError(f"{where}:{header_lineno}: {(new_path or old_path)!r} is a symlink; patches may not create or change symlinks")
            if mode_ in ("160000", "040000"):
                raise ConfigError(f"{where}:{header_lineno}: {(new_path or old_path)!r} has mode {mode_} (submodule/tree); not supported")
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
            raise ConfigError(f"{where}:{header_lineno}: diff for {old_path!r} has no hunks and no mode change")
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
    if old_len == 0 and old_start < 0 or (old_len > 0 and old_start < 1):
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
            raise ConfigError(f"{where}:{h.header_line}: hunk overlaps or precedes the previous one (old line {h.old_start})")
        end = h.old_start + h.old_len


def check_trailers(patch: Patch) -> list[str]:
    """Problems with a patch's metadata trailers (empty list when valid)."""
    problems: list[str] = []
    keys = {k.lower(): (k, v) for k, v in patch.trailers}
    for req in REQUIRED_TRAILERS:
        if req.lower() not in keys:
            problems.append(f"missing trailer {req}:")
    theme = patch.theme
    if theme is not None and theme not in THEMES:
        problems.append(f"Overlay-Theme {theme!r} is not one of {', '.join(THEMES)}")
    numerics = patch.numerics
    if numerics is not None and numerics not in NUMERICS:
        problems.append(f"Overlay-Numerics {numerics!r} is not one of {', '.join(NUMERICS)}")
    status = patch.upstream_status
    if status is not None:
        word, _, rest = status.partition(" ")
        if word not in UPSTREAM_STATUS:
            problems.append(f"Upstream-Status {status!r} must start with one of {', '.join(UPSTREAM_STATUS)}")
        elif word in ("Submitted", "Backport") and not rest.strip():
            problems.append(f"Upstream-Status {word} needs a URL (e.g. `{word} https://github.com/...`)")
        elif word == "Inappropriate" and not rest.strip():
            problems.append("Upstream-Status Inappropriate needs a reason")
    check = patch.check
    if check is not None and not check.strip():
        problems.append("Overlay-Check is empty")
    if not patch.body.strip() or len([line for line in patch.body.splitlines() if line.strip()]) <= len(patch.trailers):
        problems.append("the message has no body: say what changes, why, and what was measured")
    return problems


def slugify(subject: str, *, limit: int = 52) -> str:
    """git format-patch's file-name slug of a subject line."""
    out = []
    prev_dash = True
    for ch in subject:
        if ch.isascii() and (ch.isalnum() or ch in "_."):
            out.append(ch)
            prev_dash = False
        elif not prev_dash:
            out.append("-")
            prev_dash = True
    slug = "".join(out).strip("-.")
    while ".." in slug:
        slug = slug.replace("..", ".")
    return slug[:limit].rstrip("-.") or "patch"


# ---------------------------------------------------------------- series file writer (refresh and rebase)


def render_series(
    old_text: str, *, header: str, names: Sequence[str], previous: Mapping[str, str] | None = None
) -> str:
    """The ``series`` file listing ``names`` under ``header``, keeping every comment and blank line of ``old_text``.

    A run of comment and blank lines belongs to the entry after it and travels with that entry when patches are
    renumbered or reordered; an entry's own trailing ``# comment`` stays on its line. Comments of an entry that is
    gone stay where it was (before the next entry that is kept); those after the last entry stay at the end.
    ``previous`` says which old entry each new name continues (new -> old); without it a name continues the old
    entry of the same name, else the one with the same slug (the name without its ``NNNN-`` number).
    """
    lines = old_text.splitlines()[1:]
    blocks: list[tuple[list[str], str, str]] = []  # (comment lines before, entry name, the entry's trailing text)
    pending: list[str] = []
    for line in lines:
        entry, sep, rest = line.partition("#")
        name = entry.strip()
        if not name:
            pending.append(line)
            continue
        blocks.append((pending, name, (entry[len(entry.rstrip()):] + sep + rest) if sep else ""))
        pending = []
    tail = pending
    by_name = {name: i for i, (_c, name, _t) in enumerate(blocks)}
    by_slug: dict[str, int] = {}
    for i, (_c, name, _t) in enumerate(blocks):
        by_slug.setdefault(name[5:], i)
    used: dict[int, str] = {}
    for new in names:
        old = (previous or {}).get(new)
        k = by_name.get(old) if old is not None else None
        if k is None:
            k = by_name.get(new)
        if k is None or k in used:
            k = by_slug.get(new[5:])
        if k is not None and k not in used:
            used[k] = new
    owner = {new: i for i, new in used.items()}
    orphans: list[str] = []  # comments of dropped entries, emitted before the next kept entry in old order
    carried: dict[int, list[str]] = {}
    for i, (comments, _name, _t) in enumerate(blocks):
        if i in used:
            carried[i] = orphans + comments
            orphans = []
        else:
            orphans += comments
    out = [header]
    for new in names:
        at = owner.get(new)
        if at is None:
            out.append(new)
            continue
        out += carried[at]
        out.append(new + blocks[at][2])
    out += orphans + tail
    while len(out) > 1 and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"
