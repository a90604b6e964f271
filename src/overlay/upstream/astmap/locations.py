"""Which Python symbols a patch's hunks sit in, and whether they still sit there on another tree (``ast`` only).

- :func:`symbols` lists the functions and classes of a module with their line spans (decorators included) and dotted
  qualified names (``Engine.step``, ``make_sampler.sampler``).
- :func:`hunk_locations` says, for each hunk of a patch, which symbols its changed lines sit in, in the tree the patch
  applies to (its pre-image). Module-level code is ``<module>``; a file that is not Python, or does not parse, gives
  no symbols.
- :func:`hunk_moves` is the hunk-location check shared by ``rebase`` and ``lint``: given a patch at the pinned base and
  the same patch as it applies to another tree, it reports each hunk whose enclosing function/class is not the one it
  sat in at the pinned base.
- :func:`compare_symbol` says what upstream did to one symbol between two trees: unchanged, changed, rewritten, moved,
  renamed or deleted.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from overlay.core.series import FileDiff, Hunk, Patch
from overlay.schemas.documents import MovedHunk
from overlay.upstream.astmap.symbols import MODULE, Symbol, innermost, symbols


@dataclass(frozen=True)
class HunkLocation:
    path: str  # repo-root path of the file the hunk changes (pre-image path)
    index: int  # 1-based hunk number within its file diff
    line: int  # pre-image line of the hunk's first change
    symbols: tuple[str, ...]  # innermost enclosing symbols of its changed lines, in order; () when not Python
    changed: tuple[bytes, ...] = field(repr=False)  # the '-' and '+' lines, to pair hunks of two versions

    def describe(self) -> str:
        return ", ".join(self.symbols) if self.symbols else "(not Python)"


def _indent(line: bytes) -> int | None:
    stripped = line.lstrip(b" \t")
    if not stripped.strip():
        return None
    return len(line) - len(stripped)


def hunk_symbols(syms: list[Symbol], hunk: Hunk) -> tuple[tuple[str, ...], int]:
    """The innermost symbols the hunk's changed lines sit in, and the pre-image line of its first change."""
    pos = hunk.old_start if hunk.old_len else hunk.old_start + 1  # next pre-image line
    found: list[str] = []
    first = 0
    pending_insert: list[bytes] = []

    def insertion(before: int, added: list[bytes]) -> str:
        indents = [i for i in (_indent(a) for a in added) if i is not None]
        candidates = [s for s in syms if s.start <= before <= s.end] if before >= 1 else []
        if indents:
            candidates = [s for s in candidates if s.indent < indents[0]]
        if not candidates:
            return MODULE
        return max(candidates, key=lambda s: (s.start, -s.end)).qualname

    replacing = (
        False  # '+' lines right after '-' lines replace them: they belong where the removed lines were
    )
    for line in hunk.lines:
        if line.op == "+":
            if not replacing:
                pending_insert.append(line.text)
            first = first or max(pos - 1, 1)
            continue
        if pending_insert:
            found.append(insertion(pos - 1, pending_insert))
            pending_insert = []
        replacing = line.op == "-"
        if line.op == "-":
            sym = innermost(syms, pos)
            found.append(sym.qualname if sym else MODULE)
            first = first or pos
        pos += 1
    if pending_insert:
        found.append(insertion(pos - 1, pending_insert))
    return tuple(dict.fromkeys(found)), first or hunk.old_start


def hunk_locations(patch: Patch, preimage: Callable[[str], bytes | None]) -> list[HunkLocation]:
    """Where each hunk of ``patch`` sits; ``preimage(path)`` gives a file of the tree the patch applies to."""
    out: list[HunkLocation] = []
    for fd in patch.files:
        path = fd.old_path or fd.new_path or ""
        if fd.old_path is None:  # a file the patch adds: its symbols are those of the added text
            added = added_source(fd)
            syms = symbols(added) if path.endswith(".py") else None
            for index, hunk in enumerate(fd.hunks, start=1):
                changed = tuple(line.op.encode() + line.text for line in hunk.lines if line.op != " ")
                names: tuple[str, ...] = ()
                if syms is not None:
                    names = tuple(s.qualname for s in syms if "." not in s.qualname) or (MODULE,)
                out.append(HunkLocation(path=path, index=index, line=0, symbols=names, changed=changed))
            continue
        data = preimage(fd.old_path)
        syms = symbols(data) if data is not None and path.endswith(".py") else None
        for index, hunk in enumerate(fd.hunks, start=1):
            changed = tuple(line.op.encode() + line.text for line in hunk.lines if line.op != " ")
            if syms is None:
                out.append(
                    HunkLocation(path=path, index=index, line=hunk.old_start, symbols=(), changed=changed)
                )
                continue
            names, first = hunk_symbols(syms, hunk)
            out.append(HunkLocation(path=path, index=index, line=first, symbols=names, changed=changed))
    return out


def added_source(fd: FileDiff) -> bytes:
    """The text of a file a patch adds (its '+' lines)."""
    return b"".join(line.text for h in fd.hunks for line in h.lines if line.op == "+")


@dataclass(frozen=True)
class HunkMove:
    path: str  # path in the new tree
    index: int  # hunk number in the new patch's file diff
    before: tuple[str, ...]  # enclosing symbols at the pinned base
    after: tuple[str, ...]  # enclosing symbols where it applies now

    def describe(self) -> str:
        return (
            f"{self.path} hunk #{self.index}: was in {', '.join(self.before)}, now in {', '.join(self.after)}"
        )

    def to_json(self) -> MovedHunk:
        return {"path": self.path, "hunk": self.index, "before": list(self.before), "after": list(self.after)}


def hunk_moves(
    old_patch: Patch,
    old_preimage: Callable[[str], bytes | None],
    new_patch: Patch,
    new_preimage: Callable[[str], bytes | None],
    *,
    renames: Mapping[str, str] | None = None,
) -> list[HunkMove]:
    """Hunks of ``new_patch`` whose enclosing symbols differ from those of the matching hunk of ``old_patch``.

    Hunks are paired per file (following ``renames`` old -> new path) by position, never by content: each old hunk's
    first changed line is mapped through the line diff between the two pre-images (:class:`LineMap`), and each new
    hunk is paired with the old hunk that lands nearest to it. A patch that adds the same line to several functions
    is therefore compared function by function, and a patch that gained or lost a hunk in a 3-way merge still is.
    """
    renames = renames or {}
    old_locs = hunk_locations(old_patch, old_preimage)
    new_locs = hunk_locations(new_patch, new_preimage)
    by_path: dict[str, list[HunkLocation]] = {}
    old_path_of: dict[str, str] = {}
    for loc in old_locs:
        target = renames.get(loc.path, loc.path)
        by_path.setdefault(target, []).append(loc)
        old_path_of[target] = loc.path
    maps: dict[str, LineMap] = {}
    moves: list[HunkMove] = []
    for loc in new_locs:
        candidates = by_path.get(loc.path, [])
        if not candidates or not loc.symbols:
            continue
        if loc.path not in maps:
            maps[loc.path] = LineMap(old_preimage(old_path_of[loc.path]), new_preimage(loc.path))
        line_map = maps[loc.path]
        new_rank = [c.index for c in new_locs if c.path == loc.path].index(loc.index)
        best = min(
            enumerate(candidates),
            key=lambda ic: (abs(line_map(ic[1].line) - loc.line), abs(ic[0] - new_rank)),
        )[1]
        if best.symbols and _names(best.symbols) != _names(loc.symbols):
            moves.append(HunkMove(path=loc.path, index=loc.index, before=best.symbols, after=loc.symbols))
    return moves


class LineMap:
    """Where a line of one version of a file is in another version (1-based), from the line diff between them.

    A line inside an unchanged run maps exactly; a line upstream changed or removed maps to where its run of changes
    starts in the other version. Byte-identical files map every line to itself without diffing.
    """

    def __init__(self, old: bytes | None, new: bytes | None) -> None:
        self.identical = old == new
        self.blocks: list[tuple[int, int, int]] = []
        if not self.identical:
            a, b = (old or b"").splitlines(), (new or b"").splitlines()
            sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
            self.blocks = [(m.a, m.b, m.size) for m in sm.get_matching_blocks()]

    def __call__(self, line: int) -> int:
        if self.identical:
            return line
        i = line - 1
        prev_end_b = 0
        for a, b, n in self.blocks:
            if a <= i < a + n:
                return b + (i - a) + 1
            if a > i:
                return prev_end_b + 1
            prev_end_b = b + n
        return prev_end_b + 1


def _names(symbols: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(set(symbols)))


# ------------------------------------------------------------------ upstream changes to one symbol


def check_hunk_locations(
    base: Mapping[str, bytes],
    target: Mapping[str, bytes],
    patches: Sequence[Patch],
    *,
    package_root: str = "",
) -> list[tuple[str, HunkMove]]:
    """The hunk-location check in memory (no git), for ``lint`` or any caller holding two trees.

    Each patch is applied in order, exactly, to ``base`` (the pinned tree, wheel layout) and, allowing offsets but never
    fuzz, to ``target`` (another tree: a new release, an edited pin). Returns ``(patch name, move)`` for every hunk
    whose enclosing function or class in ``target`` differs from the one at ``base``. A patch that does not apply to
    ``target`` even with offsets raises PatchError naming it (that is ``rebase``'s business, not this check's).
    """
    from overlay.core.patching import MemoryTree, apply_patch, map_path
    from overlay.upstream.relocate import relocate_patch

    before, after = MemoryTree(dict(base)), MemoryTree(dict(target))
    out: list[tuple[str, HunkMove]] = []
    for patch in patches:
        moved, _placements = relocate_patch(after, patch, package_root=package_root)
        snap_before = {p: before.read(map_path(p, package_root, patch=patch)) for p in patch.paths}
        snap_after = {p: after.read(map_path(p, package_root, patch=patch)) for p in patch.paths}
        out += [(patch.name, m) for m in hunk_moves(patch, snap_before.get, moved, snap_after.get)]
        apply_patch(before, patch, package_root=package_root)
        apply_patch(after, moved, package_root=package_root)
    return out
