"""What `overlay review` found, as frozen data, and its JSON form and summary lines (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from overlay.schemas.documents import ReviewReport
from overlay.upstream.astmap import HunkLocation, HunkMove, SymbolChange

RangeKind = Literal["identical", "context-only", "changed", "dropped", "added"]


@dataclass(frozen=True)
class TouchedSymbol:
    change: SymbolChange  # always reads --from -> --to, named as at --from (new_* at --to)
    patches: tuple[str, ...]
    at: str = ""  # ``path::symbol`` as the hunks name it (in the series that located them)

    @property
    def key(self) -> str:
        return f"{self.change.path}::{self.change.qualname}"


@dataclass(frozen=True)
class TouchedFile:
    path: str
    new_path: str | None
    status: Literal["unchanged", "changed", "renamed", "deleted", "added-upstream", "added-by-series"]
    added: int
    removed: int
    patches: tuple[str, ...]


@dataclass(frozen=True)
class PatchReview:
    name: str
    subject: str
    hunks: tuple[HunkLocation, ...]
    rebase_class: str | None = None
    rebase_detail: str | None = None

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f"{h.path}::{s}" for h in self.hunks for s in h.symbols))


@dataclass(frozen=True)
class Duplicate:
    patch: str
    evidence: Literal["reverse-applies", "ast-equivalent", "added-lines", "empty-merge"]
    detail: str


@dataclass(frozen=True)
class RangeDiffEntry:
    old: str | None
    new: str | None
    marker: str  # = ! < >
    kind: RangeKind
    subject: str
    text: str = field(repr=False)
    old_diff: str = field(default="", repr=False)
    new_diff: str = field(default="", repr=False)
    moved: tuple[HunkMove, ...] = ()
    note: str = ""  # for a dropped patch in a replay: its rebase class


@dataclass(frozen=True)
class ReviewResult:
    engine: str
    from_version: str
    to_version: str
    anchor: Literal["old", "new"]  # which series located the hunks (the series at A, or at B)
    old_source: str
    new_source: str
    patches: tuple[PatchReview, ...]
    files: tuple[TouchedFile, ...]
    symbols: tuple[TouchedSymbol, ...]
    duplicates: tuple[Duplicate, ...]
    range_diff: tuple[RangeDiffEntry, ...] | None
    notes: tuple[str, ...]
    seconds: float
    elsewhere: tuple[
        tuple[TouchedFile, tuple[SymbolChange, ...]], ...
    ] = ()  # upstream changes outside our symbols
    json_path: Path | None = None
    html_path: Path | None = None

    @property
    def flags(self) -> tuple[TouchedSymbol, ...]:
        return tuple(s for s in self.symbols if s.change.flagged)

    @property
    def moved_hunks(self) -> tuple[tuple[str, HunkMove], ...]:
        return tuple((e.new or "", m) for e in self.range_diff or () for m in e.moved)

    @property
    def flagged_count(self) -> int:
        """Flagged symbols plus hunk-location warnings: everything a person must look at."""
        return len(self.flags) + len(self.moved_hunks)

    @property
    def unchanged(self) -> tuple[TouchedSymbol, ...]:
        return tuple(s for s in self.symbols if s.change.status == "unchanged")


def to_json(r: ReviewResult) -> ReviewReport:
    return {
        "version": 1,
        "engine": r.engine,
        "from": r.from_version,
        "to": r.to_version,
        "anchor": r.anchor,
        "series": {"from": r.old_source or None, "to": r.new_source or None},
        "notes": list(r.notes),
        "patches": [
            {
                "name": p.name,
                "subject": p.subject,
                "rebase_class": p.rebase_class,
                "rebase_detail": p.rebase_detail,
                "hunks": [
                    {"path": h.path, "hunk": h.index, "line": h.line, "symbols": list(h.symbols)}
                    for h in p.hunks
                ],
            }
            for p in r.patches
        ],
        "files": [
            {
                "path": f.path,
                "new_path": f.new_path,
                "status": f.status,
                "added": f.added,
                "removed": f.removed,
                "patches": list(f.patches),
            }
            for f in r.files
        ],
        "symbols": [
            {
                "path": s.change.path,
                "symbol": s.change.qualname,
                "kind": s.change.kind,
                "status": s.change.status,
                "flagged": s.change.flagged,
                "new_path": s.change.new_path,
                "new_symbol": s.change.new_qualname,
                "similarity": round(s.change.similarity, 3),
                "added": s.change.added,
                "removed": s.change.removed,
                "signature": list(s.change.signature) if s.change.signature else None,
                "note": s.change.note,
                "patches": list(s.patches),
                "summary": s.change.describe(),
            }
            for s in r.symbols
        ],
        "flags": [s.change.describe() for s in r.flags]
        + [f"hunk moved in {n}: {m.describe()}" for n, m in r.moved_hunks],
        "flagged": r.flagged_count,
        "unchanged": len(r.unchanged),
        "elsewhere": [
            {
                "path": f.path,
                "new_path": f.new_path,
                "changes": [
                    {
                        "symbol": c.qualname,
                        "status": c.status,
                        "new_symbol": c.new_qualname,
                        "added": c.added,
                        "removed": c.removed,
                        "summary": c.describe(),
                    }
                    for c in changes
                ],
            }
            for f, changes in r.elsewhere
        ],
        "duplicates": [{"patch": d.patch, "evidence": d.evidence, "detail": d.detail} for d in r.duplicates],
        "range_diff": None
        if r.range_diff is None
        else [
            {
                "old": e.old,
                "new": e.new,
                "marker": e.marker,
                "kind": e.kind,
                "subject": e.subject,
                "note": e.note,
                "moved_hunks": [m.to_json() for m in e.moved],
                "text": e.text,
            }
            for e in r.range_diff
        ],
        "seconds": round(r.seconds, 3),
    }


def summary_lines(r: ReviewResult) -> list[str]:
    out = [
        (
            f"review {r.engine} {r.from_version} -> {r.to_version}: {len(r.patches)} patches touch {len(r.files)} files, "
            f"{len(r.symbols)} symbols; {r.flagged_count} flagged ({len(r.flags)} symbols, {len(r.moved_hunks)} moved "
            f"hunks), {len(r.duplicates)} possible duplicates"
        )
    ]
    for note in r.notes:
        out.append(f"  NOTE {note}")
    for f in r.files:
        where = f" -> {f.new_path}" if f.status == "renamed" else ""
        what = (
            "added by the series"
            if f.status == "added-by-series"
            else f"{f.status.replace('-upstream', '')} upstream"
        )
        out.append(
            f"  file  {f.path}{where}: {what} (+{f.added} -{f.removed})  [{', '.join(p[:4] for p in f.patches)}]"
        )
    new_files = [
        s
        for s in r.symbols
        if s.change.status == "added-by-series" and "file the series adds" in s.change.note
    ]
    for s in r.symbols:
        if s.change.status == "unchanged" or s in new_files:
            continue
        tag = "FLAG" if s.change.flagged else "    "
        out.append(f"  {tag}  {s.change.describe()}  [{', '.join(p[:4] for p in s.patches)}]")
    if new_files:
        out.append(
            f"        {len(new_files)} symbols are in files the series adds "
            f"({', '.join(dict.fromkeys(s.change.path for s in new_files))})"
        )
    if r.unchanged:
        out.append(f"        {len(r.unchanged)} more symbols we patch are unchanged upstream")
    for f, changes in r.elsewhere:
        out.append(
            f"  also  {f.path}: upstream changed {len(changes)} other symbols ("
            + ", ".join(f"{c.qualname} {c.status}" for c in changes[:6])
            + (" ..." if len(changes) > 6 else "")
            + ")"
        )
    for d in r.duplicates:
        out.append(f"  DUP   {d.patch}: {d.detail} (candidate for dropping)")
    if r.range_diff is not None:
        out.append(f"range-diff (series at {r.from_version} -> series at {r.to_version}):")
        for e in r.range_diff:
            out.append(
                f"  {(e.old or '-')[:4]:>4} {e.marker} {(e.new or '-')[:4]:<4} {e.kind:<12} {e.subject}"
                + (f"  ({e.note})" if e.note else "")
            )
            for m in e.moved:
                out.append(f"  FLAG   WARNING hunk moved: {m.describe()}")
    return out
