"""Self-contained HTML for ``overlay review``: one file, inline CSS, no scripts, no network assets.

Side-by-side diffs (old left, new right) for every symbol upstream changed and for every patch the range-diff shows
as changed; flagged symbols and changed patches are expanded, the rest folded in ``<details>``.
"""

from __future__ import annotations

import difflib
import html
from typing import TYPE_CHECKING

from overlay import __version__

if TYPE_CHECKING:
    from overlay.upstream.astmap import SymbolChange
    from overlay.upstream.review.model import RangeDiffEntry, ReviewResult, TouchedSymbol

CSS = """
:root { --add: #e6ffec; --del: #ffebe9; --addw: #abf2bc; --delw: #ffc0b8; --mute: #6e7781; --line: #d0d7de; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; background: #fff; }
header { background: #24292f; color: #fff; padding: 16px 24px; }
header h1 { margin: 0 0 4px; font-size: 20px; }
header .meta { color: #c9d1d9; font-size: 12px; }
main { padding: 8px 24px 40px; }
h2 { border-bottom: 1px solid var(--line); padding-bottom: 4px; margin-top: 28px; font-size: 17px; }
table.list { border-collapse: collapse; width: 100%; margin: 8px 0; }
table.list th, table.list td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
table.list th { background: #f6f8fa; }
code, .code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; margin: 1px 2px; white-space: nowrap;
         border: 1px solid var(--line); background: #f6f8fa; }
.s-unchanged, .c-clean, .k-identical { background: #dafbe1; border-color: #4ac26b; }
.s-changed, .c-offset, .c-merged, .k-context-only { background: #fff8c5; border-color: #d4a72c; }
.s-rewritten, .s-moved, .s-renamed, .s-deleted, .c-conflict, .c-obsolete, .k-changed { background: #ffebe9; border-color: #ff8182; }
.c-upstreamed, .k-dropped, .s-added-by-series, .s-added-upstream, .k-added { background: #ddf4ff; border-color: #54aeff; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 12px 0; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card b { display: block; font-size: 22px; }
.card.alert b { color: #cf222e; }
details { border: 1px solid var(--line); border-radius: 6px; margin: 10px 0; }
details > summary { cursor: pointer; padding: 6px 10px; background: #f6f8fa; font-weight: 600; }
details .desc { padding: 4px 10px; color: var(--mute); }
table.sbs { border-collapse: collapse; width: 100%; table-layout: fixed; }
table.sbs th { background: #f6f8fa; font-weight: 600; font-size: 12px; padding: 4px; border-bottom: 1px solid var(--line); }
table.sbs td { padding: 0 6px; white-space: pre-wrap; word-break: break-all; vertical-align: top; }
table.sbs td.ln { width: 44px; color: var(--mute); text-align: right; user-select: none; background: #fafbfc; }
table.sbs td.del { background: var(--del); }
table.sbs td.add { background: var(--add); }
table.sbs td.empty { background: #f6f8fa; }
table.sbs tr.skip td { background: #ddf4ff; color: var(--mute); text-align: center; }
.warn { color: #9a6700; font-weight: 600; }
pre.rd { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 12px; }
.note { color: var(--mute); }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def side_by_side(
    old: str, new: str, *, left: str, right: str, context: int = 3, left_start: int = 1, right_start: int = 1
) -> str:
    """Two texts as a two-column table: equal runs folded to ``context`` lines, changed lines tinted."""
    a, b = old.splitlines(), new.splitlines()
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    rows: list[str] = []
    groups = list(sm.get_grouped_opcodes(context))
    if not groups:
        return f'<p class="note">identical ({len(a)} lines)</p>'
    for g, group in enumerate(groups):
        if g or group[0][1] > 0:
            rows.append('<tr class="skip"><td colspan="4">&#8943;</td></tr>')
        for tag, i1, i2, j1, j2 in group:
            n = max(i2 - i1, j2 - j1)
            for k in range(n):
                i, j = i1 + k, j1 + k
                lcls = "code" if tag == "equal" else "code del"
                rcls = "code" if tag == "equal" else "code add"
                lt = (
                    f'<td class="ln">{i + left_start}</td><td class="{lcls}">{esc(a[i])}</td>'
                    if i < i2
                    else '<td class="ln"></td><td class="empty"></td>'
                )
                rt = (
                    f'<td class="ln">{j + right_start}</td><td class="{rcls}">{esc(b[j])}</td>'
                    if j < j2
                    else '<td class="ln"></td><td class="empty"></td>'
                )
                rows.append(f"<tr>{lt}{rt}</tr>")
    if groups[-1][-1][2] < len(a):
        rows.append('<tr class="skip"><td colspan="4">&#8943;</td></tr>')
    head = (
        f'<tr><th style="width:44px"></th><th>{esc(left)}</th><th style="width:44px"></th>'
        f"<th>{esc(right)}</th></tr>"
    )
    return f'<table class="sbs">{head}{"".join(rows)}</table>'


def _badge(text: str, cls: str) -> str:
    return f'<span class="badge {cls}">{esc(text)}</span>'


def _symbol_badge(key: str, status: str) -> str:
    """``file.py::Symbol (status)``: the file's base name on the badge, its whole path in the tooltip."""
    path, _, qual = key.partition("::")
    name = path.rsplit("/", 1)[-1]
    return (
        f'<span class="badge s-{esc(status)}" title="{esc(path)}">{esc(name)}::{esc(qual)} '
        f"({esc(status or '?')})</span>"
    )


def _symbol_block(s: TouchedSymbol, a: str, b: str) -> str:
    return _change_block(s.change, a, b, patches=s.patches)


def _change_block(
    ch: SymbolChange, a: str, b: str, *, patches: tuple[str, ...] = (), fold: bool = False
) -> str:
    is_open = " open" if not fold and (ch.flagged or ch.status == "changed") else ""
    target = f"{ch.new_path}::{ch.new_qualname}" if ch.new_qualname else f"{ch.path}::{ch.qualname}"
    desc = [esc(ch.describe())]
    if patches:
        desc.append("patched by " + ", ".join(f"<code>{esc(p)}</code>" for p in patches))
    if ch.signature:
        desc.append(
            f"signature: <code>{esc(ch.signature[0])}</code> &rarr; <code>{esc(ch.signature[1])}</code>"
        )
    body = side_by_side(
        ch.old_source,
        ch.new_source,
        left=f"{a}: {ch.path}::{ch.qualname}",
        right=f"{b}: {target}",
        left_start=ch.old_line,
        right_start=ch.new_line,
    )
    return (
        f'<details{is_open} id="sym-{esc(ch.path)}::{esc(ch.qualname)}"><summary><code>{esc(ch.path)}::'
        f"{esc(ch.qualname)}</code> {_badge(ch.status, 's-' + ch.status)}</summary>"
        f'<div class="desc">{"<br>".join(desc)}</div>{body}</details>'
    )


def _range_block(e: RangeDiffEntry, a: str, b: str) -> str:
    is_open = " open" if e.kind == "changed" or e.moved else ""
    title = f"{e.old or '-'} {e.marker} {e.new or '-'}"
    warn = "".join(f'<div class="desc warn">hunk moved: {esc(m.describe())}</div>' for m in e.moved)
    if e.kind in ("identical", "dropped", "added"):
        body = f'<pre class="rd">{esc(e.old_diff or e.new_diff)}</pre>' if e.kind != "identical" else ""
    else:
        body = side_by_side(e.old_diff, e.new_diff, left=f"{e.old} (at {a})", right=f"{e.new} (at {b})")
        if e.text.strip():
            body += f'<details><summary>git range-diff</summary><pre class="rd">{esc(e.text)}</pre></details>'
    return (
        f"<details{is_open}><summary><code>{esc(title)}</code> {_badge(e.kind, 'k-' + e.kind)} "
        f"{esc(e.subject)}</summary>{warn}{body}</details>"
    )


def render_review(r: ReviewResult) -> str:
    a, b = r.from_version, r.to_version
    flags = r.flags
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>overlay review {esc(r.engine)} {esc(a)} &rarr; {esc(b)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<header><h1>overlay review: {esc(r.engine)} {esc(a)} &rarr; {esc(b)}</h1>",
        (
            f'<div class="meta">series at {esc(a)}: {esc(r.old_source or "none")} &middot; series at {esc(b)}: '
            f"{esc(r.new_source or 'none')} &middot; hunks located in the series at {esc(a if r.anchor == 'old' else b)}"
            f" &middot; overlay {esc(__version__)}</div></header><main>"
        ),
    ]
    for note in r.notes:
        parts.append(f'<p class="note">{esc(note)}</p>')
    changed = [s for s in r.symbols if s.change.status not in ("unchanged", "added-by-series", "not-python")]
    parts.append('<div class="cards">')
    for label, value, alert in (
        ("patches", len(r.patches), False),
        ("files touched", len(r.files), False),
        ("symbols touched", len(r.symbols), False),
        ("changed upstream", len(changed), False),
        ("flagged", r.flagged_count, bool(r.flagged_count)),
        ("unchanged", len(r.unchanged), False),
        ("possible duplicates", len(r.duplicates), bool(r.duplicates)),
    ):
        parts.append(f'<div class="card{" alert" if alert else ""}"><b>{value}</b>{esc(label)}</div>')
    parts.append("</div>")

    parts.append(
        '<h2 id="flags">Flagged: symbols we patch that upstream rewrote, moved, renamed or deleted, and hunks '
        "that moved to another symbol</h2>"
    )
    if flags or r.moved_hunks:
        parts.append('<table class="list"><tr><th>symbol</th><th>upstream</th><th>patches</th></tr>')
        for s in flags:
            parts.append(
                f"<tr><td><code>{esc(s.key)}</code></td><td>{_badge(s.change.status, 's-' + s.change.status)} "
                f"{esc(s.change.describe())}</td><td>{'<br>'.join(esc(p) for p in s.patches)}</td></tr>"
            )
        for name, m in r.moved_hunks:
            parts.append(
                f"<tr><td><code>{esc(m.path)}</code> hunk #{m.index}</td><td>{_badge('hunk moved', 's-moved')} "
                f"{esc(m.describe())}</td><td>{esc(name)}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append('<p class="note">none</p>')

    parts.append(
        '<h2 id="patches">Patches</h2><table class="list"><tr><th>patch</th><th>subject</th>'
        "<th>rebase</th><th>symbols its hunks sit in</th></tr>"
    )
    status_of = {s.at or s.key: s.change.status for s in r.symbols}
    for p in r.patches:
        cls = (
            _badge(p.rebase_class, "c-" + p.rebase_class)
            + f'<br><span class="note">{esc(p.rebase_detail)}</span>'
            if p.rebase_class
            else '<span class="note">-</span>'
        )
        syms = (
            " ".join(_symbol_badge(k, status_of.get(k, "")) for k in p.symbols)
            or '<span class="note">(not Python)</span>'
        )
        parts.append(
            f"<tr><td><code>{esc(p.name)}</code></td><td>{esc(p.subject)}</td><td>{cls}</td><td>{syms}</td></tr>"
        )
    parts.append("</table>")

    parts.append(
        '<h2 id="duplicates">New upstream code that duplicates a patch (candidates for dropping)</h2>'
    )
    if r.duplicates:
        parts.append('<table class="list"><tr><th>patch</th><th>evidence</th><th>detail</th></tr>')
        for d in r.duplicates:
            parts.append(
                f"<tr><td><code>{esc(d.patch)}</code></td><td>{esc(d.evidence)}</td><td>{esc(d.detail)}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append('<p class="note">none</p>')

    parts.append(
        f'<h2 id="symbols">Upstream changes {esc(a)} &rarr; {esc(b)} in the symbols our hunks sit in</h2>'
    )
    for s in sorted(r.symbols, key=lambda s: (not s.change.flagged, s.key)):
        if s.change.status != "unchanged":
            parts.append(_symbol_block(s, a, b))
    if r.unchanged:
        parts.append(
            f"<details><summary>{len(r.unchanged)} more symbols we patch are unchanged upstream</summary>"
            '<div class="desc">'
            + " ".join(_symbol_badge(s.key, "unchanged") for s in r.unchanged)
            + "</div></details>"
        )

    parts.append(
        f'<h2 id="elsewhere">Elsewhere in the files we touch: upstream changes {esc(a)} &rarr; {esc(b)} '
        "outside the symbols our hunks sit in</h2>"
    )
    if not r.elsewhere:
        parts.append('<p class="note">none</p>')
    for f, changes in r.elsewhere:
        inner = "".join(_change_block(c, a, b, fold=True) for c in changes)
        parts.append(
            f"<details><summary><code>{esc(f.path)}</code>: {len(changes)} other symbols changed upstream "
            f"({esc(', '.join(c.qualname for c in changes[:8]))}{' ...' if len(changes) > 8 else ''})</summary>"
            f'<div class="desc">{inner}</div></details>'
        )

    parts.append(
        '<h2 id="files">Files the series touches</h2><table class="list"><tr><th>file</th><th>upstream</th>'
        "<th>lines +/-</th><th>patches</th></tr>"
    )
    for f in r.files:
        where = f" &rarr; <code>{esc(f.new_path)}</code>" if f.status == "renamed" else ""
        parts.append(
            f"<tr><td><code>{esc(f.path)}</code>{where}</td><td>{_badge(f.status, 's-' + f.status)}</td>"
            f"<td>+{f.added} -{f.removed}</td><td>{'<br>'.join(esc(p) for p in f.patches)}</td></tr>"
        )
    parts.append("</table>")

    parts.append(f'<h2 id="range-diff">Range-diff: the series at {esc(a)} &rarr; the series at {esc(b)}</h2>')
    if r.range_diff is None:
        parts.append('<p class="note">not available (no copy of the series at the older release)</p>')
    else:
        parts.append(
            '<table class="list"><tr><th>at '
            + esc(a)
            + "</th><th></th><th>at "
            + esc(b)
            + "</th><th>what changed</th><th>subject</th></tr>"
        )
        for e in r.range_diff:
            parts.append(
                f"<tr><td><code>{esc(e.old or '-')}</code></td><td>{esc(e.marker)}</td>"
                f"<td><code>{esc(e.new or '-')}</code></td><td>{_badge(e.kind, 'k-' + e.kind)}"
                f"{''.join('<br><span class=warn>hunk moved</span>' for _m in e.moved[:1])}</td>"
                f"<td>{esc(e.subject)}{'<br><span class=note>' + esc(e.note) + '</span>' if e.note else ''}"
                "</td></tr>"
            )
        parts.append("</table>")
        for e in r.range_diff:
            parts.append(_range_block(e, a, b))
    parts.append("</main></body></html>\n")
    return "\n".join(parts)
