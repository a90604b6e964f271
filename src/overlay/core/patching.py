"""Strict apply: every hunk must match exactly, at exactly the line numbers it names. No fuzz, no offset.

When a hunk does not match, the error names the patch, the file, the hunk and the line, shows the expected and
found lines, and says whether the context exists elsewhere (an offset) or nearly matches (fuzz), so the user knows
the patch must be refreshed, not that the tool should have guessed.
"""

from __future__ import annotations

import difflib
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from overlay.core.archive_policy import check_patch
from overlay.core.series import FileDiff, Hunk, Patch
from overlay.errors import ConfigError, IntegrityError, PatchError
from overlay.fsutil import resolve_inside, safe_relpath


class Tree(Protocol):
    """A file tree the applier edits: paths are POSIX, relative to the tree's root."""

    def read(self, path: str) -> bytes | None: ...

    def write(self, path: str, data: bytes, *, executable: bool | None = None) -> None: ...

    def delete(self, path: str) -> None: ...

    def is_executable(self, path: str) -> bool: ...


class MemoryTree:
    """An in-memory tree: {path: bytes} plus the executable bit. Used for wheels (and lint)."""

    def __init__(self, files: dict[str, bytes] | None = None, executable: Iterable[str] = ()) -> None:
        self.files: dict[str, bytes] = dict(files or {})
        self.executable: set[str] = set(executable)

    def read(self, path: str) -> bytes | None:
        return self.files.get(path)

    def write(self, path: str, data: bytes, *, executable: bool | None = None) -> None:
        self.files[path] = data
        if executable is True:
            self.executable.add(path)
        elif executable is False:
            self.executable.discard(path)

    def delete(self, path: str) -> None:
        self.files.pop(path, None)
        self.executable.discard(path)

    def is_executable(self, path: str) -> bool:
        return path in self.executable


class DirTree:
    """A tree on disk (a git checkout). Refuses paths that go through symlinks."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, path: str) -> Path:
        return resolve_inside(self.root, safe_relpath(path, what="patch path"), what="patch path")

    def read(self, path: str) -> bytes | None:
        p = self._path(path)
        return p.read_bytes() if p.is_file() else None

    def write(self, path: str, data: bytes, *, executable: bool | None = None) -> None:
        p = self._path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        if executable is not None:
            mode = p.stat().st_mode
            bits = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
            p.chmod(mode | bits if executable else mode & ~bits)

    def delete(self, path: str) -> None:
        self._path(path).unlink()

    def is_executable(self, path: str) -> bool:
        return bool(self._path(path).stat().st_mode & stat.S_IXUSR)


@dataclass(frozen=True)
class AppliedFile:
    path: str  # tree path after mapping
    kind: str


@dataclass(frozen=True)
class AppliedPatch:
    patch: Patch
    files: tuple[AppliedFile, ...]


def map_path(path: str, package_root: str, *, patch: Patch) -> str:
    """Map a repo-root path to the tree layout (strip ``package_root``); refuse paths outside it."""
    if not package_root:
        return path
    prefix = package_root.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ConfigError(
            f"patch {patch.name} touches {path!r}, which is outside the package root {package_root!r} "
            "and so not part of the wheel",
            tip="patch files under the package root only (paths are relative to the upstream git repository root)",
        )
    return path[len(prefix) :]


def apply_patch(tree: Tree, patch: Patch, *, package_root: str = "") -> AppliedPatch:
    """Apply one patch to ``tree`` exactly. All its files are checked before any is written: the archive policy first
    (no ``.git`` path, no installer metadata or ``.pth`` added; overlay.core.archive_policy), then every hunk."""
    check_patch(patch, package_root=package_root)
    staged: list[tuple[FileDiff, str | None, str | None, bytes | None, bool | None]] = []
    pending: dict[str, bytes | None] = {}
    for fd in patch.files:
        old = map_path(fd.old_path, package_root, patch=patch) if fd.old_path else None
        new = map_path(fd.new_path, package_root, patch=patch) if fd.new_path else None
        for p in (old, new):
            if p is not None:
                safe_relpath(p, what=f"patch {patch.name}: path")

        def current(p: str) -> bytes | None:
            return pending[p] if p in pending else tree.read(p)

        if fd.kind == "add":
            assert new is not None
            if current(new) is not None:
                raise PatchError(
                    f"patch {patch.name} creates {fd.new_path!r}, but it already exists at the base"
                )
            data = _apply_hunks(b"", fd, patch, new)
            staged.append((fd, None, new, data, fd.new_mode == "100755"))
            pending[new] = data
        elif fd.kind == "delete":
            assert old is not None
            base = current(old)
            if base is None:
                raise PatchError(
                    f"patch {patch.name} deletes {fd.old_path!r}, which does not exist at the base"
                )
            if fd.hunks:
                result = _apply_hunks(base, fd, patch, old)
                if result != b"":
                    raise PatchError(
                        f"patch {patch.name} deletes {fd.old_path!r}, but the file has content the patch does not remove"
                    )
            staged.append((fd, old, None, None, None))
            pending[old] = None
        else:
            assert old is not None and new is not None
            base = current(old)
            if base is None:
                raise PatchError(
                    f"patch {patch.name} changes {fd.old_path!r}, which does not exist at the base",
                    tip="the file may have moved upstream; see `overlay rebase`",
                )
            if fd.kind in ("rename", "copy") and old != new and current(new) is not None:
                raise PatchError(f"patch {patch.name} {fd.kind}s to {fd.new_path!r}, which already exists")
            data = _apply_hunks(base, fd, patch, old)
            exe: bool | None = None
            if fd.new_mode is not None and fd.old_mode is not None and fd.new_mode != fd.old_mode:
                exe = fd.new_mode == "100755"
            elif fd.kind in ("rename", "copy"):
                exe = tree.is_executable(old)
            staged.append((fd, old, new, data, exe))
            if fd.kind == "rename" and old != new:
                pending[old] = None
            pending[new] = data
    applied: list[AppliedFile] = []
    for fd, old, new, new_data, exe in staged:
        if fd.kind == "delete":
            assert old is not None
            tree.delete(old)
            applied.append(AppliedFile(path=old, kind="delete"))
            continue
        assert new is not None and new_data is not None
        if fd.kind == "rename" and old is not None and old != new:
            tree.delete(old)
        tree.write(new, new_data, executable=exe)
        applied.append(AppliedFile(path=new, kind=fd.kind))
    return AppliedPatch(patch=patch, files=tuple(applied))


def apply_series(tree: Tree, patches: Sequence[Patch], *, package_root: str = "") -> list[AppliedPatch]:
    return [apply_patch(tree, p, package_root=package_root) for p in patches]


def split_lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def _apply_hunks(base: bytes, fd: FileDiff, patch: Patch, tree_path: str) -> bytes:
    lines = split_lines(base)
    out: list[bytes] = []
    cursor = 0  # next unread line of ``lines`` (0-based)
    for index, hunk in enumerate(fd.hunks, start=1):
        start = hunk.old_start - 1 if hunk.old_len else hunk.old_start
        expected = list(hunk.old_lines)
        found = lines[start : start + len(expected)]
        if start < cursor or found != expected:
            raise PatchError(_mismatch_message(patch, fd, index, hunk, lines, start, expected))
        out.extend(lines[cursor:start])
        out.extend(hunk.new_lines)
        cursor = start + len(expected)
    out.extend(lines[cursor:])
    data = b"".join(out)
    if fd.kind == "add" and fd.hunks and fd.hunks[0].old_len != 0:
        raise IntegrityError(f"patch {patch.name}: new file {fd.new_path!r} has a hunk with old lines")
    return data


def _find_offsets(lines: list[bytes], expected: list[bytes], near: int) -> list[int]:
    if not expected:
        return []
    hits = [i for i in range(len(lines) - len(expected) + 1) if lines[i : i + len(expected)] == expected]
    return sorted(hits, key=lambda i: abs(i - near))


def _fuzz_match(lines: list[bytes], hunk: Hunk, start: int) -> int | None:
    """The fuzz (context lines ignored at each end) GNU patch would have needed here, if <= 2."""
    body = list(hunk.lines)
    for fuzz in (1, 2):
        head = sum(1 for line in body[:fuzz] if line.op == " ")
        tail = sum(1 for line in body[len(body) - fuzz :] if line.op == " ")
        if head < fuzz and tail < fuzz:
            continue
        trimmed = [line.text for line in body[head : len(body) - tail] if line.op != "+"]
        s = start + head
        if trimmed and lines[s : s + len(trimmed)] == trimmed:
            return fuzz
    return None


def _show(line: bytes) -> str:
    text = line.decode("utf-8", "replace")
    if text.endswith("\n"):
        return text[:-1]
    return text + "  [no newline at end of file]"


def _mismatch_message(
    patch: Patch, fd: FileDiff, index: int, hunk: Hunk, lines: list[bytes], start: int, expected: list[bytes]
) -> str:
    path = fd.old_path or fd.new_path
    found = lines[start : start + len(expected)]
    first_bad = next(
        (k for k, (a, b) in enumerate(zip(expected, found)) if a != b), min(len(expected), len(found))
    )
    at = start + first_bad + 1
    head = (
        f"patch {patch.name} does not apply: {path}, hunk #{index} (@@ -{hunk.old_start},{hunk.old_len} "
        f"+{hunk.new_start},{hunk.new_len} @@{(' ' + hunk.section) if hunk.section else ''}) "
        f"at line {at} (patch file line {hunk.header_line})"
    )
    detail: list[str] = []
    if start >= len(lines) and expected:
        detail.append(f"the file has only {len(lines)} lines")
    offsets = [o for o in _find_offsets(lines, expected, start) if o != start]
    if offsets:
        off = offsets[0] - start
        detail.append(
            f"the exact context is at line {offsets[0] + 1} instead (offset {off:+d}); overlay never applies with an offset"
        )
    else:
        fuzz = _fuzz_match(lines, hunk, start)
        if fuzz is not None:
            detail.append(
                f"it would apply only with fuzz {fuzz} (edge context lines differ); overlay never applies with fuzz"
            )
    diff = list(
        difflib.unified_diff(
            [_show(x) for x in expected],
            [_show(x) for x in found],
            fromfile="expected (patch)",
            tofile=f"found ({path} lines {start + 1}-{start + len(found)})",
            lineterm="",
            n=1,
        )
    )
    shown = diff[:24] + ([f"... ({len(diff) - 24} more lines)"] if len(diff) > 24 else [])
    return "\n".join([head, *(f"  {d}" for d in detail), *(f"    {d}" for d in shown)])


def touched_paths(patches: Iterable[Patch], package_root: str) -> Iterator[str]:
    for patch in patches:
        for fd in patch.files:
            for p in fd.paths:
                yield map_path(p, package_root, patch=patch)


def pure(path: str) -> PurePosixPath:
    return PurePosixPath(path)
