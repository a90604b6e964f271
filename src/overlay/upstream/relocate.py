"""Where a patch's hunks sit in a tree other than the one it was made against: offsets (never fuzz) and reversal.

``overlay apply`` and ``lint`` never use this: they apply strictly. ``rebase`` uses it to classify a patch on a new
upstream tree: a patch whose every hunk matches exactly (all context lines) at other line numbers is ``offset``; a
patch whose *reverse* matches is already contained upstream (``upstreamed``). A relocated patch is an ordinary
:class:`~overlay.core.series.Patch` whose hunk line numbers were moved, so the strict applier applies it unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from overlay.core.patching import Tree, map_path, split_lines
from overlay.core.series import FileDiff, Hunk, Line, Patch
from overlay.errors import PatchError


@dataclass(frozen=True)
class HunkPlacement:
    path: str  # repo-root path of the file diff
    index: int  # 1-based hunk number within the file diff
    old_start: int  # where the patch says the hunk starts
    found_start: int  # where its context matched

    @property
    def offset(self) -> int:
        return self.found_start - self.old_start


def reverse_patch(patch: Patch) -> Patch:
    """The patch that undoes ``patch``: '+' and '-' swapped, adds become deletes, renames go back."""
    files = []
    for fd in patch.files:
        kind = {"add": "delete", "delete": "add"}.get(fd.kind, fd.kind)
        hunks = tuple(
            Hunk(
                old_start=h.new_start,
                old_len=h.new_len,
                new_start=h.old_start,
                new_len=h.old_len,
                section=h.section,
                lines=tuple(
                    Line(op={"+": "-", "-": "+"}.get(line.op, line.op), text=line.text) for line in h.lines
                ),
                header_line=h.header_line,
            )
            for h in fd.hunks
        )
        files.append(
            FileDiff(
                kind=kind,  # type: ignore[arg-type]
                old_path=fd.new_path,
                new_path=fd.old_path,
                old_mode=fd.new_mode,
                new_mode=fd.old_mode,
                old_blob=fd.new_blob,
                new_blob=fd.old_blob,
                hunks=hunks,
            )
        )
    return dataclasses.replace(patch, files=tuple(files))


def relocate_patch(
    tree: Tree, patch: Patch, *, package_root: str = ""
) -> tuple[Patch, tuple[HunkPlacement, ...]]:
    """Move every hunk of ``patch`` to where its old lines (context included) match ``tree`` exactly.

    Offsets accumulate within a file as GNU patch does; among equally near matches the earlier wins; a hunk never
    moves above the end of the previous one. Raises PatchError naming the first hunk that matches nowhere.
    """
    files: list[FileDiff] = []
    placements: list[HunkPlacement] = []
    for fd in patch.files:
        if fd.kind == "add" or not fd.hunks:
            files.append(fd)
            continue
        assert fd.old_path is not None
        data = tree.read(map_path(fd.old_path, package_root, patch=patch))
        if data is None:
            raise PatchError(f"patch {patch.name}: {fd.old_path!r} does not exist in this tree")
        lines = split_lines(data)
        index = _LineIndex(lines)
        moved: list[Hunk] = []
        cursor = 0
        delta = 0
        for number, hunk in enumerate(fd.hunks, start=1):
            expected = list(hunk.old_lines)
            start = hunk.old_start - 1 if hunk.old_len else hunk.old_start
            want = start + delta
            found = (
                index.nearest(expected, want, cursor)
                if expected
                else (want if cursor <= want <= len(lines) else None)
            )
            if found is None:
                raise PatchError(
                    f"patch {patch.name}: {fd.old_path}, hunk #{number} (@@ -{hunk.old_start},{hunk.old_len} @@) "
                    "matches nowhere in the file, not even at another line"
                )
            delta = found - start
            cursor = found + len(expected)
            new_old_start = found + 1 if hunk.old_len else found
            shift = new_old_start - hunk.old_start
            placements.append(
                HunkPlacement(
                    path=fd.old_path, index=number, old_start=hunk.old_start, found_start=new_old_start
                )
            )
            moved.append(dataclasses.replace(hunk, old_start=new_old_start, new_start=hunk.new_start + shift))
        files.append(dataclasses.replace(fd, hunks=tuple(moved)))
    return dataclasses.replace(patch, files=tuple(files)), tuple(placements)


class _LineIndex:
    """Positions of each distinct line, so a hunk is searched only where its first line occurs."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        self.at: dict[bytes, list[int]] = {}
        for i, line in enumerate(lines):
            self.at.setdefault(line, []).append(i)

    def nearest(self, expected: list[bytes], want: int, lowest: int) -> int | None:
        n = len(expected)
        hits = [i for i in self.at.get(expected[0], ()) if i >= lowest and self.lines[i : i + n] == expected]
        if not hits:
            return None
        return min(hits, key=lambda i: (abs(i - want), i))
