"""The comparison itself: which symbols the hunks sit in, what upstream did to them, duplicates of our patches,
the range-diff (pure functions of the two trees and the two series)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from overlay.core.patching import MemoryTree, apply_patch
from overlay.core.series import Patch, Series
from overlay.errors import PatchError
from overlay.git import ops as gitops
from overlay.upstream.astmap import (
    MODULE,
    HunkMove,
    SymbolChange,
    SymbolIndex,
    added_source,
    ast_equal,
    compare_symbol,
    compare_symbol_back,
    file_changes,
    hunk_locations,
    source_of,
    symbols,
)
from overlay.upstream.outcome import Outcome
from overlay.upstream.relocate import relocate_patch, reverse_patch
from overlay.upstream.replay import location_check
from overlay.upstream.review.model import (
    Duplicate,
    PatchReview,
    RangeDiffEntry,
    RangeKind,
    ReviewResult,
    TouchedFile,
    TouchedSymbol,
)
from overlay.upstream.workspace import Workspace, commit_patch_bytes, read_blobs


def _reader(repo: Path, rev: str, paths: list[str]) -> Callable[[str], bytes | None]:
    blobs = dict(zip(paths, read_blobs(repo, [f"{rev}:{p}" for p in paths])))
    return lambda p: blobs.get(p)


def _analyse(
    engine: str,
    a: str,
    b: str,
    ws: Workspace,
    files_a: dict[str, bytes],
    files_b: dict[str, bytes],
    old: Series | None,
    new_patches: list[Patch],
    new_commits: list[str],
    outcomes: list[Outcome],
    notes: list[str],
    *,
    old_source: str,
    new_source: str,
    mapping: dict[str, str] | None,
) -> ReviewResult:
    repo = ws.repo
    renames = {p: n for p, (n, _s) in ws.renames.items()}
    index_a, index_b = SymbolIndex(files_a), SymbolIndex(files_b)
    by_outcome = {o.name: o for o in outcomes}
    if old is not None:
        anchor: Literal["old", "new"] = "old"
        anchor_patches, anchor_commits = list(old.patches), list(ws.old_commits)
        own, other = index_a, index_b
    else:
        anchor = "new"
        anchor_patches, anchor_commits = new_patches, new_commits
        own, other = index_b, index_a
    reviews: list[PatchReview] = []
    touched: dict[tuple[str, str], list[str]] = {}
    file_patches: dict[str, list[str]] = {}
    added_files: dict[str, bytes] = {}  # anchor path -> the text the series adds
    for patch, commit in zip(anchor_patches, anchor_commits):
        paths = [fd.old_path for fd in patch.files if fd.old_path]
        locs = hunk_locations(patch, _reader(repo, f"{commit}^", paths))
        o = by_outcome.get(patch.name)
        reviews.append(
            PatchReview(
                name=patch.name,
                subject=patch.subject,
                hunks=tuple(locs),
                rebase_class=o.cls if o else None,
                rebase_detail=o.detail if o else None,
            )
        )
        for fd in patch.files:
            file_patches.setdefault(fd.old_path or fd.new_path or "", []).append(patch.name)
            if fd.kind == "add" and fd.new_path:
                added_files[fd.new_path] = added_source(fd)
        for loc in locs:
            for sym in loc.symbols:
                names = touched.setdefault((loc.path, sym), [])
                if patch.name not in names:
                    names.append(patch.name)
    symbols_: list[TouchedSymbol] = []
    back = {n: p for p, n in renames.items()}
    for (path, qual), names in touched.items():
        if path in added_files:
            change = _added_by_series(path, qual, added_files[path], own, other)
        elif anchor == "old":
            change = compare_symbol(path, qual, index_a, index_b, new_path=renames.get(path))
        else:
            change = compare_symbol_back(path, qual, index_a, index_b, old_path=back.get(path))
        symbols_.append(TouchedSymbol(change=change, patches=tuple(names), at=f"{path}::{qual}"))
    symbols = symbols_
    files = _touched_files(repo, ws, file_patches, files_a, files_b, renames, anchor, set(added_files))
    elsewhere = _elsewhere(files, symbols, index_a, index_b)
    duplicates = _duplicates(repo, ws, old, index_a, index_b, renames, symbols, outcomes, b) if old else []
    range_diff: tuple[RangeDiffEntry, ...] | None = None
    if old is not None:
        range_diff = tuple(
            dataclasses.replace(e, note=f"{by_outcome[e.old].cls}: {by_outcome[e.old].detail}")
            if e.kind == "dropped" and e.old in by_outcome
            else e
            for e in _range_diff(ws, old, new_patches, new_commits, renames, mapping)
        )
    return ReviewResult(
        engine=engine,
        from_version=a,
        to_version=b,
        anchor=anchor,
        old_source=old_source,
        new_source=new_source,
        patches=tuple(reviews),
        files=tuple(files),
        symbols=tuple(symbols),
        duplicates=tuple(duplicates),
        range_diff=range_diff,
        notes=tuple(notes),
        seconds=0.0,
        elsewhere=elsewhere,
    )


def _added_by_series(path: str, qual: str, text: bytes, own: SymbolIndex, other: SymbolIndex) -> SymbolChange:
    """A symbol in a file the series adds: its source from the added text, and whether upstream has that file too."""
    syms = symbols(text) or []
    sym = next((s for s in syms if s.qualname == qual), None)
    upstream = [f for f in (own.files, other.files) if path in f]
    note = "in a file the series adds" + (f"; upstream has a {path} too" if upstream else "")
    if sym is None:
        return SymbolChange(path=path, qualname=qual, kind=None, status="added-by-series", note=note)
    return SymbolChange(
        path=path,
        qualname=qual,
        kind=sym.kind,
        status="added-by-series",
        note=note,
        new_path=path,
        new_qualname=qual,
        new_source=source_of(text.decode("utf-8", "replace"), sym),
        new_line=sym.start,
    )


def _elsewhere(
    files: list[TouchedFile], symbols: list[TouchedSymbol], index_a: SymbolIndex, index_b: SymbolIndex
) -> tuple[tuple[TouchedFile, tuple[SymbolChange, ...]], ...]:
    """For each touched file upstream changed: its changes outside the symbols our hunks sit in."""
    out = []
    for f in files:
        if f.status not in ("changed", "renamed") or f.new_path is None:
            continue
        ours = {s.change.qualname for s in symbols if s.change.path == f.path}
        ours |= {
            s.change.new_qualname
            for s in symbols
            if s.change.new_path == f.new_path and s.change.new_qualname
        }
        found = file_changes(f.path, f.new_path, index_a, index_b, skip=sorted(ours))
        if found:
            out.append((f, tuple(found)))
    return tuple(out)


def _touched_files(
    repo: Path,
    ws: Workspace,
    file_patches: dict[str, list[str]],
    files_a: dict[str, bytes],
    files_b: dict[str, bytes],
    renames: dict[str, str],
    anchor: str,
    added_by_series: set[str],
) -> list[TouchedFile]:
    counts = {
        old: (added, deleted)
        for added, deleted, old, _new in gitops.diff_numstat(repo, ws.old_base, ws.new_base)
    }
    back = {n: p for p, n in renames.items()}
    out = []
    for path, names in file_patches.items():
        a_path = path if anchor == "old" else back.get(path, path)
        b_path = renames.get(a_path, a_path)
        in_a, in_b = a_path in files_a, b_path in files_b
        added, removed = counts.get(a_path, (0, 0))
        if path in added_by_series or (not in_a and not in_b):
            status: Any = "added-by-series"
        elif not in_a:
            status = "added-upstream"
        elif not in_b:
            status = "deleted"
        elif a_path != b_path:
            status = "renamed"
        elif files_a[a_path] == files_b[b_path]:
            status = "unchanged"
        else:
            status = "changed"
        out.append(
            TouchedFile(
                path=a_path,
                new_path=b_path if in_b else None,
                status=status,
                added=added,
                removed=removed,
                patches=tuple(dict.fromkeys(names)),
            )
        )
    return out


def _meaningful(line: bytes) -> bool:
    s = line.strip()
    return len(s) >= 8 and not s.startswith(b"#")


def _duplicates(
    repo: Path,
    ws: Workspace,
    old: Series,
    index_a: SymbolIndex,
    index_b: SymbolIndex,
    renames: dict[str, str],
    symbols: list[TouchedSymbol],
    outcomes: list[Outcome],
    b: str,
) -> list[Duplicate]:
    out: list[Duplicate] = []
    outcome = {o.name: o for o in outcomes}
    for patch, commit in zip(old.patches, ws.old_commits):
        o = outcome.get(patch.name)
        # 1. the patch reverse-applies on B: upstream contains it
        tree_b = MemoryTree(
            {p: index_b.files[renames.get(p, p)] for p in patch.paths if renames.get(p, p) in index_b.files}
        )
        try:
            rev, _pl = relocate_patch(tree_b, reverse_patch(patch))
            apply_patch(MemoryTree(dict(tree_b.files)), rev)
            out.append(
                Duplicate(
                    patch.name, "reverse-applies", f"the patch reverse-applies on {b}: upstream contains it"
                )
            )
            continue
        except PatchError:
            pass
        # 2. B's version of a symbol we patch has our patched version's AST
        post_paths = [fd.new_path for fd in patch.files if fd.new_path]
        post = _reader(repo, commit, post_paths)
        found = False
        for ts in symbols:
            ch = ts.change
            if (
                patch.name not in ts.patches
                or ch.qualname == MODULE
                or ch.status not in ("changed", "rewritten", "moved", "renamed", "added-by-series")
            ):
                continue
            data = post(ch.path)
            mod = SymbolIndex({ch.path: data}) if data is not None else None
            sym = mod.find(ch.path, ch.qualname) if mod else None
            if sym is None or not ch.new_source or mod is None:
                continue
            patched = source_of(data.decode("utf-8", "replace") if data else "", sym)
            if patched != ch.old_source and ast_equal(patched, ch.new_source):
                out.append(
                    Duplicate(
                        patch.name,
                        "ast-equivalent",
                        f"{b}'s {ch.new_path}::{ch.new_qualname} has the same AST as our patched "
                        f"{ch.path}::{ch.qualname}",
                    )
                )
                found = True
                break
        if found:
            continue
        # 3. most lines the patch adds are new in B
        added = [
            line.text
            for fd in patch.files
            for h in fd.hunks
            for line in h.lines
            if line.op == "+" and _meaningful(line.text)
        ]
        if not added:
            if o is not None and o.cls == "upstreamed":
                out.append(Duplicate(patch.name, "empty-merge", o.detail))
            continue
        hits = 0
        for fd in patch.files:
            path = fd.new_path or ""
            a_lines = {x.strip() for x in index_a.files.get(path, b"").splitlines()}
            b_lines = {x.strip() for x in index_b.files.get(renames.get(path, path), b"").splitlines()}
            hits += sum(
                1
                for h in fd.hunks
                for line in h.lines
                if line.op == "+"
                and _meaningful(line.text)
                and line.text.strip() in b_lines
                and line.text.strip() not in a_lines
            )
        if hits / len(added) >= 0.8:
            out.append(
                Duplicate(
                    patch.name,
                    "added-lines",
                    f"{hits} of the {len(added)} lines the patch adds are new in {b}'s files",
                )
            )
            continue
        # 4. the replayed rebase found the 3-way merge empty
        if o is not None and o.cls == "upstreamed":
            out.append(Duplicate(patch.name, "empty-merge", o.detail))
    return out


def _changed_lines(patch: Patch) -> Counter[bytes]:
    return Counter(
        line.op.encode() + line.text
        for fd in patch.files
        for h in fd.hunks
        for line in h.lines
        if line.op != " "
    )


def _hunk_bodies(patch: Patch) -> list[tuple[str, tuple[tuple[str, bytes], ...]]]:
    return [
        (fd.path, tuple((line.op, line.text) for line in h.lines)) for fd in patch.files for h in fd.hunks
    ]


def _diff_part(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    i = text.find("\ndiff --git ")
    return text[i + 1 :] if i >= 0 else text


def pair_patches(
    old: list[Patch], new: list[Patch], mapping: dict[str, str] | None = None
) -> list[tuple[int | None, int | None]]:
    """Which patch of the new series each old patch became: by the rebase's own record (old name -> new name) when
    there is one, else by subject, else by file-name slug. Unpaired ones are dropped (old) or added (new)."""
    new_index = {p.name: j for j, p in enumerate(new)}
    taken: set[int] = set()
    pairs: list[tuple[int | None, int | None]] = []
    for i, p in enumerate(old):
        j: int | None = None
        if mapping is not None and mapping.get(p.name) in new_index:
            j = new_index[mapping[p.name]]
        if j is None:
            j = next((k for k, q in enumerate(new) if k not in taken and q.subject == p.subject), None)
        if j is None:
            j = next((k for k, q in enumerate(new) if k not in taken and q.name[5:] == p.name[5:]), None)
        if j is not None:
            taken.add(j)
        pairs.append((i, j))
    pairs += [(None, j) for j in range(len(new)) if j not in taken]
    return pairs


def _range_diff(
    ws: Workspace,
    old: Series,
    new_patches: list[Patch],
    new_commits: list[str],
    renames: dict[str, str],
    mapping: dict[str, str] | None,
) -> list[RangeDiffEntry]:
    """One entry per patch: our own pairing (the rebase knows which commit each patch became), git range-diff's
    text for each pair, and the hunk-location check."""
    repo = ws.repo
    entries: list[RangeDiffEntry] = []
    for i, j in pair_patches(list(old.patches), new_patches, mapping):
        op = old.patches[i] if i is not None else None
        np_ = new_patches[j] if j is not None else None
        text = ""
        moved: tuple[HunkMove, ...] = ()
        if op is not None and np_ is not None and i is not None and j is not None:
            if _hunk_bodies(op) == _hunk_bodies(np_):
                kind: RangeKind = "identical"
            elif _changed_lines(op) == _changed_lines(np_):
                kind = "context-only"
            else:
                kind = "changed"
            oc, nc = ws.old_commits[i], new_commits[j]
            if kind != "identical":
                text = gitops.run(
                    ["range-diff", "--no-color", "--creation-factor=100", f"{oc}^..{oc}", f"{nc}^..{nc}"],
                    cwd=repo,
                ).stdout.decode("utf-8", "replace")
                text = "\n".join(line.removeprefix("    ") for line in text.splitlines()[1:])
            moved = tuple(location_check(repo, op, oc, np_, nc, renames=renames))
            marker = "=" if kind == "identical" else "!"
        elif op is not None:
            kind, marker = "dropped", "<"
        else:
            kind, marker = "added", ">"
        either = op or np_
        entries.append(
            RangeDiffEntry(
                old=op.name if op else None,
                new=np_.name if np_ else None,
                marker=marker,
                kind=kind,
                subject=either.subject if either else "",
                text=text,
                old_diff=_diff_part(op.raw) if op else "",
                new_diff=_diff_part(commit_patch_bytes(repo, new_commits[j])) if j is not None else "",
                moved=moved,
            )
        )
    return entries
