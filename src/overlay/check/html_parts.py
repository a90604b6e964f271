"""The building blocks of the check's HTML pages: the inline CSS, escaped cells and tables, SVG bar charts and
histograms, verdict spans, and the context section (host, flags, inputs) both pages show. No network assets."""

from __future__ import annotations

import html
import json
import math
from typing import Any

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d232a;max-width:1180px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #d8dee4;padding-bottom:4px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #d8dee4;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f7}.pass{color:#116329;font-weight:600}.fail{color:#b31d28;font-weight:600}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff}.badge.pass{background:#1f883d}
.badge.fail{background:#cf222e}.badge.inconclusive{background:#9a6700}code{background:#f3f5f7;padding:0 3px}.muted{color:#636c76}svg{background:#fbfcfd}
"""


def esc(x: Any) -> str:
    return html.escape(str(x))


def num(x: Any, fmt: str = ".4g") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return format(x, fmt) if isinstance(x, float) else str(x)
    return esc(x)


def table(rows: list[list[Any]], head: list[str]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c if isinstance(c, Raw) else num(c)}</td>" for c in r) + "</tr>")
    return "".join(out) + "</table>"


class Raw(str):
    pass


def bar_chart(
    title: str,
    labels: list[str],
    values: list[float],
    *,
    lows: list[float] | None = None,
    highs: list[float] | None = None,
    unit: str = "",
    ref: float | None = None,
) -> str:
    """A horizontal bar chart (SVG) with optional min/max whiskers and a reference line."""
    w, row, left = 720, 26, 220
    h = 30 + row * len(labels)
    finite = [v for v in [*values, *(highs or []), ref or 0] if v is not None and math.isfinite(v)]
    vmax = max(finite) * 1.1 if finite and max(finite) > 0 else 1.0
    scale = (w - left - 80) / vmax
    parts = [
        f'<svg role="img" aria-label="{esc(title)}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="8" y="18" font-size="13" font-weight="600">{esc(title)}</text>',
    ]
    for i, (lab, v) in enumerate(zip(labels, values)):
        y = 28 + i * row
        parts.append(f'<text x="8" y="{y + 15}" font-size="12">{esc(lab)}</text>')
        if v is None or not math.isfinite(v):
            continue
        parts.append(
            f'<rect x="{left}" y="{y + 4}" width="{max(v * scale, 1):.1f}" height="{row - 10}" fill="#4c8bf5"/>'
        )
        if lows and highs and lows[i] is not None and highs[i] is not None:
            x1, x2 = left + lows[i] * scale, left + highs[i] * scale
            parts.append(
                f'<line x1="{x1:.1f}" x2="{x2:.1f}" y1="{y + row / 2:.1f}" y2="{y + row / 2:.1f}" stroke="#1d232a"/>'
            )
        parts.append(
            f'<text x="{left + v * scale + 6:.1f}" y="{y + 15}" font-size="12">{v:.3g}{esc(unit)}</text>'
        )
    if ref is not None:
        x = left + ref * scale
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="24" y2="{h}" stroke="#cf222e" stroke-dasharray="4 3"/>'
        )
    return "".join(parts) + "</svg>"


def histogram_svg(title: str, counts: list[int]) -> str:
    w, h, left, bottom = 720, 200, 40, 30
    n = len(counts) or 1
    cmax = max(counts) if counts and max(counts) > 0 else 1
    bw = (w - left - 10) / n
    parts = [
        f'<svg role="img" aria-label="{esc(title)}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="8" y="16" font-size="13" font-weight="600">{esc(title)}</text>',
    ]
    for i, c in enumerate(counts):
        bh = (h - bottom - 26) * (math.log1p(c) / math.log1p(cmax))
        parts.append(
            f'<rect x="{left + i * bw:.1f}" y="{h - bottom - bh:.1f}" width="{bw - 2:.1f}" height="{bh:.1f}" fill="#8250df"/>'
        )
    for i in range(0, n + 1, max(1, n // 6)):
        x = left + i * bw
        parts.append(f'<text x="{x:.1f}" y="{h - 10}" font-size="11">1e{-12 + 12 * i // n}</text>')
    return "".join(parts) + "</svg>"


def verdict_span(v: str | None) -> Raw:
    cls = {"pass": "pass", "better": "pass", "fail": "fail", "worse": "fail"}.get(v or "", "muted")
    return Raw(
        f"<span class='{cls}'>{esc((v or '?').upper() if v in ('fail', 'worse') else (v or '?'))}</span>"
    )


def context_section(report: dict[str, Any]) -> str:
    """Host facts, flags and inputs: what the numbers were measured on and with."""
    out = []
    host = report.get("host")
    if host:
        versions = host.get("versions") or {}
        rows = [[k, v] for k, v in host.items() if k != "versions"]
        rows += [
            [f"{arm} versions", ", ".join(f"{k} {v}" for k, v in vs.items())] for arm, vs in versions.items()
        ]
        out.append("<h2>Host</h2>" + table(rows, ["fact", "value"]))
    fl = report.get("flags")
    if fl:
        rows = [
            ["requested", fl["requested"]],
            ["set in the patched arm", ", ".join(fl["set"]) or "none"],
            ["active patches", len(fl["active_patches"])],
            ["inactive patches", len(fl["inactive_patches"])],
            ["gate class", (report.get("series") or {}).get("gate_class")],
        ]
        rows += [
            [f"not exercised: {n['patch'] or 'CLI options'}", f"{' '.join(n['flags'])}: {n['why']}"]
            for n in fl.get("not_exercised", [])
        ]
        out.append("<h2>Flags</h2>" + table(rows, ["", "value"]))
    inp = report.get("inputs")
    if inp:
        out.append(
            "<h2>Inputs</h2>"
            + table(
                [[k, json.dumps(v) if isinstance(v, dict) else v] for k, v in inp.items()], ["input", "value"]
            )
        )
    return "".join(out)
