"""What upstream did to one symbol between two trees: unchanged, changed, rewritten, moved, renamed or deleted."""

from __future__ import annotations

import ast
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from overlay.upstream.astmap.symbols import MODULE, Symbol, SymbolKind, _decode, source_of, symbols

SymbolStatus = Literal[
    "unchanged",
    "changed",
    "rewritten",
    "moved",
    "renamed",
    "deleted",
    "added-upstream",
    "added-by-series",
    "not-python",
]


REWRITE_BELOW = 0.5  # similarity under which a changed symbol counts as rewritten


RENAME_AT_LEAST = 0.6  # body similarity for a differently named symbol to count as the same one renamed


@dataclass(frozen=True)
class SymbolChange:
    path: str  # file in the old tree
    qualname: str
    kind: SymbolKind | None
    status: SymbolStatus
    new_path: str | None = None  # where it is in the new tree (moved/renamed/renamed file)
    new_qualname: str | None = None
    similarity: float = 1.0
    old_source: str = ""
    new_source: str = ""
    added: int = 0  # lines added/removed upstream within the symbol
    removed: int = 0
    signature: tuple[str, str] | None = None  # (old, new) when the def/class line changed
    note: str = ""
    old_line: int = 1  # first line of old_source / new_source in their files
    new_line: int = 1

    @property
    def flagged(self) -> bool:
        """A symbol we patch that upstream rewrote, moved, renamed or deleted."""
        return self.status in ("rewritten", "moved", "renamed", "deleted")

    def describe(self) -> str:
        where = f"{self.path}::{self.qualname}"
        if self.status == "unchanged":
            return f"{where}: unchanged upstream"
        if self.status == "changed":
            return f"{where}: changed upstream (+{self.added} -{self.removed} lines, similarity {self.similarity:.2f})"
        if self.status == "rewritten":
            return f"{where}: rewritten upstream (similarity {self.similarity:.2f}, +{self.added} -{self.removed} lines)"
        if self.status in ("moved", "renamed"):
            return f"{where}: {self.status} upstream to {self.new_path}::{self.new_qualname} (similarity {self.similarity:.2f})"
        if self.status == "deleted":
            return f"{where}: deleted upstream{(' (' + self.note + ')') if self.note else ''}"
        if self.status == "added-upstream":
            return f"{where}: added upstream{(' (' + self.note + ')') if self.note else ''}"
        if self.status == "added-by-series":
            return f"{where}: added by the series{(' (' + self.note + ')') if self.note else ''}"
        return f"{where}: {self.status}"


def similarity(a: str, b: str) -> float:
    la = [line.strip() for line in a.splitlines() if line.strip()]
    lb = [line.strip() for line in b.splitlines() if line.strip()]
    if not la and not lb:
        return 1.0
    return difflib.SequenceMatcher(None, la, lb, autojunk=False).ratio()


def _body(src: str) -> str:
    """A symbol's source without its decorators and def/class line(s), for rename detection."""
    lines = src.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip().endswith(":") and line.lstrip().startswith(("def ", "async def ", "class ")):
            return "".join(lines[i + 1 :])
    return "".join(lines[1:])


def _header(src: str) -> str:
    """The def/class statement up to its colon (multi-line signatures joined)."""
    out: list[str] = []
    started = False
    for line in src.splitlines():
        s = line.strip()
        if not started and not s.startswith(("def ", "async def ", "class ")):
            continue
        started = True
        out.append(s)
        if s.endswith(":") and _balanced(" ".join(out)):
            break
    return " ".join(out)


def _balanced(text: str) -> bool:
    return text.count("(") == text.count(")") and text.count("[") == text.count("]")


def _counts(a: str, b: str) -> tuple[int, int]:
    added = removed = 0
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


class SymbolIndex:
    """Parsed modules of one tree, parsed on first use."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self.files = files
        self._parsed: dict[str, tuple[str, list[Symbol]] | None] = {}
        self._all: list[tuple[str, Symbol]] | None = None

    def module(self, path: str) -> tuple[str, list[Symbol]] | None:
        if path not in self._parsed:
            data = self.files.get(path)
            syms = symbols(data) if data is not None and path.endswith(".py") else None
            self._parsed[path] = (_decode(data), syms) if data is not None and syms is not None else None
        return self._parsed[path]

    def find(self, path: str, qualname: str) -> Symbol | None:
        mod = self.module(path)
        if mod is None:
            return None
        return next((s for s in mod[1] if s.qualname == qualname), None)

    def everywhere(self) -> list[tuple[str, Symbol]]:
        if self._all is None:
            self._all = []
            for path in sorted(self.files):
                mod = self.module(path) if path.endswith(".py") else None
                if mod is not None:
                    self._all.extend((path, s) for s in mod[1])
        return self._all


def compare_symbol(
    path: str, qualname: str, old: SymbolIndex, new: SymbolIndex, *, new_path: str | None = None
) -> SymbolChange:
    """What upstream did to ``path::qualname`` between the ``old`` and ``new`` trees.

    ``new_path`` is where the file is in the new tree when git detected a rename (default: the same path).
    """
    target = new_path or path
    old_mod = old.module(path)
    if old_mod is None:
        return SymbolChange(path=path, qualname=qualname, kind=None, status="not-python")
    if qualname == MODULE:
        return _compare_module(path, old, new, target)
    old_sym = old.find(path, qualname)
    if old_sym is None:
        twin = new.find(target, qualname)
        twin_mod = new.module(target)
        if twin is None or twin_mod is None:
            return SymbolChange(path=path, qualname=qualname, kind=None, status="added-by-series")
        return SymbolChange(
            path=path,
            qualname=qualname,
            kind=twin.kind,
            status="added-by-series",
            new_path=target,
            new_qualname=qualname,
            note=f"upstream now has a {qualname} in {target} too",
            new_source=source_of(twin_mod[0], twin),
            new_line=twin.start,
        )
    old_src = source_of(old_mod[0], old_sym)
    base: dict[str, Any] = {
        "path": path,
        "qualname": qualname,
        "kind": old_sym.kind,
        "old_source": old_src,
        "old_line": old_sym.start,
    }
    new_mod = new.module(target)
    same = new.find(target, qualname) if new_mod else None
    if same is not None and new_mod is not None:
        new_src = source_of(new_mod[0], same)
        if new_src == old_src:
            return SymbolChange(
                **base,
                status="unchanged",
                new_path=target,
                new_qualname=qualname,
                new_source=new_src,
                new_line=same.start,
            )
        sim = similarity(old_src, new_src)
        added, removed = _counts(old_src, new_src)
        sig = (_header(old_src), _header(new_src))
        return SymbolChange(
            **base,
            status="changed" if sim >= REWRITE_BELOW else "rewritten",
            new_path=target,
            new_qualname=qualname,
            similarity=sim,
            new_source=new_src,
            new_line=same.start,
            added=added,
            removed=removed,
            signature=sig if sig[0] != sig[1] else None,
        )
    # not under the same name in the same file: moved (same name elsewhere), renamed (same body), or deleted
    candidates: list[tuple[float, str, Symbol, str]] = []
    if new_mod is not None:
        for s in new_mod[1]:
            if s.name == old_sym.name and s.kind == old_sym.kind:
                src = source_of(new_mod[0], s)
                candidates.append((similarity(old_src, src), target, s, src))
    if not candidates:
        for p, s in new.everywhere():
            if s.name == old_sym.name and s.kind == old_sym.kind and (s.qualname == qualname or p != target):
                mod = new.module(p)
                assert mod is not None
                src = source_of(mod[0], s)
                sim = similarity(old_src, src)
                if s.qualname == qualname or sim >= RENAME_AT_LEAST:
                    candidates.append((sim, p, s, src))
    if candidates:
        sim, p, s, src = max(candidates, key=lambda c: c[0])
        added, removed = _counts(old_src, src)
        return SymbolChange(
            **base,
            status="moved",
            new_path=p,
            new_qualname=s.qualname,
            similarity=sim,
            new_source=src,
            added=added,
            removed=removed,
            new_line=s.start,
        )
    if new_mod is not None:
        old_names = {s.qualname for s in old_mod[1]}
        body = _body(old_src)
        renamed: list[tuple[float, Symbol, str]] = []
        for s in new_mod[1]:
            if s.kind != old_sym.kind or s.qualname in old_names:
                continue
            src = source_of(new_mod[0], s)
            sim = similarity(body, _body(src))
            if sim >= RENAME_AT_LEAST:
                renamed.append((sim, s, src))
        if renamed:
            sim, s, src = max(renamed, key=lambda c: c[0])
            added, removed = _counts(old_src, src)
            return SymbolChange(
                **base,
                status="renamed",
                new_path=target,
                new_qualname=s.qualname,
                similarity=sim,
                new_source=src,
                added=added,
                removed=removed,
                new_line=s.start,
            )
    note = f"{target} is gone" if new_mod is None and target not in new.files else ""
    return SymbolChange(**base, status="deleted", note=note)


def compare_symbol_back(
    path: str, qualname: str, old: SymbolIndex, new: SymbolIndex, *, old_path: str | None = None
) -> SymbolChange:
    """What upstream did, from the ``old`` tree to the ``new`` one, to a symbol named as it is in the **new** tree
    (``path::qualname``; ``old_path`` is the file's path in the old tree when git detected a rename).

    The change always reads old -> new: a symbol only the new tree has is ``added-upstream``, lines added are those
    the new tree has more, the old source is the old tree's. The result is named as in the old tree (``path``,
    ``qualname``) with ``new_path``/``new_qualname`` the new tree's names, like :func:`compare_symbol`'s.
    """
    back = compare_symbol(path, qualname, new, old, new_path=old_path)
    return reverse_change(back)


def reverse_change(ch: SymbolChange) -> SymbolChange:
    """A :class:`SymbolChange` computed from the new tree back to the old one, turned to read old -> new."""
    if ch.status in ("not-python", "added-by-series"):
        return replace(ch, note=ch.note.replace("upstream now has", "the older release has"))
    if ch.status == "deleted":  # in the new tree, not in the old: upstream added it
        return replace(
            ch,
            status="added-upstream",
            new_path=ch.path,
            new_qualname=ch.qualname,
            old_source="",
            new_source=ch.old_source,
            new_line=ch.old_line,
            old_line=1,
            added=ch.removed,
            removed=ch.added,
            note=ch.note.replace("is gone", "is new"),
        )
    return replace(
        ch,
        path=ch.new_path or ch.path,
        qualname=ch.new_qualname or ch.qualname,
        new_path=ch.path,
        new_qualname=ch.qualname,
        old_source=ch.new_source,
        new_source=ch.old_source,
        old_line=ch.new_line,
        new_line=ch.old_line,
        added=ch.removed,
        removed=ch.added,
        signature=(ch.signature[1], ch.signature[0]) if ch.signature else None,
    )


def _compare_module(path: str, old: SymbolIndex, new: SymbolIndex, target: str) -> SymbolChange:
    """Module-level code: the file with every function and class body left out."""
    old_mod, new_mod = old.module(path), new.module(target)
    assert old_mod is not None
    old_src = _module_level(*old_mod)
    if new_mod is None:
        return SymbolChange(
            path=path,
            qualname=MODULE,
            kind=None,
            status="deleted",
            old_source=old_src,
            note=f"{target} is gone",
        )
    new_src = _module_level(*new_mod)
    if old_src == new_src:
        return SymbolChange(
            path=path,
            qualname=MODULE,
            kind=None,
            status="unchanged",
            new_path=target,
            new_qualname=MODULE,
            old_source=old_src,
            new_source=new_src,
        )
    sim = similarity(old_src, new_src)
    added, removed = _counts(old_src, new_src)
    return SymbolChange(
        path=path,
        qualname=MODULE,
        kind=None,
        status="changed" if sim >= REWRITE_BELOW else "rewritten",
        new_path=target,
        new_qualname=MODULE,
        similarity=sim,
        old_source=old_src,
        new_source=new_src,
        added=added,
        removed=removed,
    )


def _module_level(text: str, syms: list[Symbol]) -> str:
    lines = text.splitlines(keepends=True)
    keep = [True] * len(lines)
    for s in syms:
        if "." in s.qualname:
            continue
        for i in range(s.def_line, s.end):  # keep the def line itself, drop the body
            keep[i] = False
    return "".join(line for line, k in zip(lines, keep) if k)


def ast_equal(a: str, b: str) -> bool:
    """Two pieces of source (a symbol each) with the same AST, ignoring formatting and comments."""
    import textwrap

    try:
        ta = ast.parse(textwrap.dedent(a))
        tb = ast.parse(textwrap.dedent(b))
    except (SyntaxError, ValueError):
        return False
    return ast.dump(ta) == ast.dump(tb)


def file_changes(
    path: str, new_path: str, old: SymbolIndex, new: SymbolIndex, *, skip: Sequence[str] = ()
) -> list[SymbolChange]:
    """Upstream's changes to one file outside the symbols in ``skip``: the innermost functions and classes whose source
    differs between ``old``'s ``path`` and ``new``'s ``new_path`` (added and deleted ones too), and module-level code.
    """
    mod_a, mod_b = old.module(path), new.module(new_path)
    if mod_a is None or mod_b is None:
        return []
    src_a = {s.qualname: source_of(mod_a[0], s) for s in mod_a[1]}
    syms_b = {s.qualname: s for s in mod_b[1]}
    src_b = {q: source_of(mod_b[0], s) for q, s in syms_b.items()}
    names = list(dict.fromkeys([*src_a, *src_b]))
    changed = [q for q in names if src_a.get(q) != src_b.get(q)]
    out: list[SymbolChange] = []
    skipped = set(skip)
    for q in changed:
        if q in skipped or any(o.startswith(q + ".") for o in changed):
            continue
        if q in src_a:
            out.append(compare_symbol(path, q, old, new, new_path=new_path))
        else:
            s = syms_b[q]
            out.append(
                SymbolChange(
                    path=path,
                    qualname=q,
                    kind=s.kind,
                    status="added-upstream",
                    new_path=new_path,
                    new_qualname=q,
                    new_source=src_b[q],
                    new_line=s.start,
                    added=len(src_b[q].splitlines()),
                )
            )
    if MODULE not in skipped and _outside_symbols(*mod_a) != _outside_symbols(*mod_b):
        out.append(_compare_module(path, old, new, new_path))
    return out


def _outside_symbols(text: str, syms: list[Symbol]) -> list[str]:
    """The module's lines outside every top-level function and class (decorators and def lines included)."""
    lines = text.splitlines()
    inside = {i for s in syms if "." not in s.qualname for i in range(s.start - 1, s.end)}
    return [line for i, line in enumerate(lines) if i not in inside and line.strip()]
