"""The check report as one self-contained HTML page (inline CSS and SVG plots; no network assets)."""

from __future__ import annotations

import html
import json
import math
from typing import Any

from overlay.check.stats import fmt_ratio

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d232a;max-width:1180px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #d8dee4;padding-bottom:4px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #d8dee4;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f7}.pass{color:#116329;font-weight:600}.fail{color:#b31d28;font-weight:600}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff}.badge.pass{background:#1f883d}
.badge.fail{background:#cf222e}.badge.inconclusive{background:#9a6700}code{background:#f3f5f7;padding:0 3px}.muted{color:#636c76}svg{background:#fbfcfd}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _num(x: Any, fmt: str = ".4g") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return format(x, fmt) if isinstance(x, float) else str(x)
    return _e(x)


def _table(rows: list[list[Any]], head: list[str]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c if isinstance(c, _Raw) else _num(c)}</td>" for c in r) + "</tr>")
    return "".join(out) + "</table>"


class _Raw(str):
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
        f'<svg role="img" aria-label="{_e(title)}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="8" y="18" font-size="13" font-weight="600">{_e(title)}</text>',
    ]
    for i, (lab, v) in enumerate(zip(labels, values)):
        y = 28 + i * row
        parts.append(f'<text x="8" y="{y + 15}" font-size="12">{_e(lab)}</text>')
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
            f'<text x="{left + v * scale + 6:.1f}" y="{y + 15}" font-size="12">{v:.3g}{_e(unit)}</text>'
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
        f'<svg role="img" aria-label="{_e(title)}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="8" y="16" font-size="13" font-weight="600">{_e(title)}</text>',
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


def _mechanism_section(report: dict[str, Any]) -> str:
    """The census table (one row per declared mechanism) and, per record, the sites that moved most."""
    records = report.get("mechanism")
    if records is None:
        return ""
    from overlay.check.census import top_primitives_diff, top_sites_diff

    ms = report.get("mechanism_summary") or {}
    verdict = {True: ("pass", "holds"), False: ("fail", "DOES NOT HOLD"), None: ("muted", "not measured")}
    head = (
        f"<h2>Mechanism census</h2><p class='muted'>{_e(ms.get('declared', len(records)))} declared, "
        f"{_e(ms.get('hold', 0))} hold, {_e(ms.get('do_not_hold', 0))} do not hold, "
        f"{_e(ms.get('not_measured', 0))} not measured; per step, {_e(ms.get('steps', '?'))} steps per run"
        + ("" if ms.get("gated", True) else "; <b>not gated in this run</b>")
        + "</p>"
    )
    if not records:
        return head + "<p>No patch declares an Overlay-Mechanism.</p>"
    rows = [
        [
            r["patch"],
            r["declared"],
            r["flag"],
            r["stock"],
            r["patched"],
            r.get("flag_off"),
            _Raw(f"<span class='{verdict[r['holds']][0]}'>{verdict[r['holds']][1]}</span>"),
            r.get("note") or "",
        ]
        for r in records
    ]
    out = [head, _table(rows, ["patch", "declared", "flag", "stock", "patched", "flag off", "holds", "note"])]
    moved = []
    for r in records:
        diff, prims = top_sites_diff(r), top_primitives_diff(r)
        if diff or prims:
            moved.append(
                f"<h3>{_e(r['patch'])}: {_e(r['declared'])}</h3>"
                + (
                    _table(
                        [[site, a, b, b - a] for site, a, b in diff],
                        ["site (per step)", "before", "after", "change"],
                    )
                    if diff
                    else ""
                )
                + (
                    _table(
                        [[name, a, b, b - a] for name, a, b in prims],
                        ["primitive (per step)", "before", "after", "change"],
                    )
                    if prims
                    else ""
                )
            )
    if moved:
        out.append(
            "<h3 class='muted'>What moved (top sites and primitives, without -> with the patch, in the "
            "variant it is judged on)</h3>" + "".join(moved)
        )
    return "".join(out)


def _verdict(v: str | None) -> _Raw:
    cls = {"pass": "pass", "better": "pass", "fail": "fail", "worse": "fail"}.get(v or "", "muted")
    return _Raw(
        f"<span class='{cls}'>{_e((v or '?').upper() if v in ('fail', 'worse') else (v or '?'))}</span>"
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
        out.append("<h2>Host</h2>" + _table(rows, ["fact", "value"]))
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
        out.append("<h2>Flags</h2>" + _table(rows, ["", "value"]))
    inp = report.get("inputs")
    if inp:
        out.append(
            "<h2>Inputs</h2>"
            + _table(
                [[k, json.dumps(v) if isinstance(v, dict) else v] for k, v in inp.items()], ["input", "value"]
            )
        )
    return "".join(out)


def sampling_section(sm: dict[str, Any] | None) -> str:
    if not sm:
        return ""
    worst = sm.get("worst") or {}
    return f"<h2>Sampling distribution at T={_e(sm['temperature'])}</h2>" + _table(
        [
            ["prompts x seeds x positions", f"{sm['prompts']} x {sm['seeds']} x {sm['positions']}"],
            ["chi-square tests (informative)", sm["informative_tests"]],
            ["Bonferroni threshold", sm["threshold"]],
            [
                "lowest p",
                f"{sm['min_p']:.3g} (prompt {worst.get('prompt')}, position {worst.get('position')})",
            ],
            ["distributions equal", sm["equal"]],
            ["runs identical seed for seed", f"{sm['identical_runs']}/{sm['runs']}"],
        ],
        ["measure", "value"],
    )


def render(report: dict[str, Any]) -> str:
    v = report.get("verdict", "?")
    out = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>overlay check {_e(report['engine'])}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>overlay check: {_e(report['engine'])} <span class='badge {_e(v)}'>{_e(v.upper())}</span></h1>",
        (
            f"<div class='muted'>{_e(report.get('created', ''))} &middot; mode {_e(report.get('mode'))} &middot; "
            f"series class <b>{_e(report['series']['class'])}</b> &middot; gate class "
            f"<b>{_e(report['series'].get('gate_class', report['series']['class']))}</b> &middot; "
            f"{len(report['series']['patches'])} patches</div>"
        ),
    ]
    arms = report["arms"]
    out.append(
        "<h2>Arms</h2>"
        + _table([[k, a["wheel"], a["version"]] for k, a in arms.items()], ["arm", "wheel", "version"])
    )
    if report.get("model"):
        m = report["model"]
        out.append(
            f"<p>Model: <code>{_e(m.get('kind') or m['path'])}</code>; real drafter: "
            f"<code>{_e(m.get('draft_kind') or m.get('draft'))}</code></p>"
        )
    for note in report.get("notes", []):
        out.append(f"<p class='muted'>Note: {_e(note)}</p>")
    out.append(
        "<h2>Gates</h2>"
        + _table(
            [
                [
                    g["subject"],
                    g["class"],
                    g["gate"],
                    _verdict(g.get("status") or ("pass" if g["passed"] else "fail")),
                    g["detail"],
                ]
                for g in report.get("gates", [])
            ],
            ["subject", "class", "gate", "result", "detail"],
        )
    )
    out.append(_mechanism_section(report))
    out.append(context_section(report))
    out.append(
        "<h2>Patches</h2>"
        + _table(
            [
                [
                    p["name"],
                    p["numerics"],
                    p["theme"],
                    " ".join(p.get("flags") or []),
                    p.get("active", True),
                    p["subject"],
                ]
                for p in report["series"]["patches"]
            ],
            ["patch", "numerics", "theme", "flags", "active", "subject"],
        )
    )
    g = report.get("greedy")
    if g:
        fd = g.get("first_divergence")
        out.append(
            "<h2>Greedy outputs</h2>"
            + _table(
                [
                    ["prompts", g["prompts"]],
                    ["identical", f"{g['identical_count']}/{g['prompts']}"],
                    ["logprobs bit-identical", g["logprobs_bit_identical"]],
                    ["max |d logprob|", g["logprobs_max_abs_diff"]],
                    ["first divergence", "none" if not fd else json.dumps(fd)],
                ],
                ["measure", "value"],
            )
        )
    lg = report.get("logits")
    if lg and lg.get("positions"):
        out.append(
            "<h2>Teacher-forced logits</h2>"
            + _table(
                [
                    ["positions", lg["positions"]],
                    ["sequences", lg["sequences"]],
                    ["bit-identical", lg["bit_identical"]],
                    ["max |d logprob|", lg["max_abs_diff"]],
                    ["KLD mean (SE)", f"{lg['kld_mean']:.3g} ({lg['kld_se']:.2g})"],
                    [
                        "KLD median / p99 / max",
                        f"{lg['kld_median']:.3g} / {lg['kld_p99']:.3g} / {lg['kld_max']:.3g}",
                    ],
                    ["top-1 agreement (SE)", f"{lg['top1_agreement']:.5f} ({lg['top1_se']:.2g})"],
                    ["delta NLL (SE)", f"{lg['dnll']:.3g} ({lg['dnll_se']:.2g})"],
                ],
                ["measure", "value"],
            )
        )
        out.append(
            histogram_svg("KLD(stock || patched) per position, log10 bins (log count)", lg["kld_histogram"])
        )
    sp = report.get("speculative")
    if sp:
        rows = []
        for label in ("self", "never", "real"):
            if label in sp:
                for arm in ("stock", "patched"):
                    s = sp[label][arm]
                    rows.append(
                        [
                            label,
                            arm,
                            s["acceptance_rate"],
                            s["acceptance_length"],
                            s["accepted"],
                            s["drafted"],
                            sp[label].get(f"{arm}_identical_to_serial"),
                        ]
                    )
        out.append(
            f"<h2>Speculative decoding (k={_e(sp['k'])})</h2>"
            + _table(
                rows,
                [
                    "draft",
                    "arm",
                    "acceptance rate",
                    "acceptance length",
                    "accepted",
                    "drafted",
                    "identical to serial",
                ],
            )
        )
    s = report.get("speed")
    if s:
        out.append("<h2>Speed</h2>")
        for metric, unit in (("decode_tok_s", " tok/s"), ("prefill_tok_s", " tok/s"), ("cold_start_s", " s")):
            arms_with = [a for a in ("stock", "patched") if metric in s.get(a, {})]
            if not arms_with:
                continue
            out.append(
                bar_chart(
                    f"{metric} per arm (median, whiskers min-max)",
                    arms_with,
                    [s[a][metric]["median"] for a in arms_with],
                    lows=[s[a][metric]["min"] for a in arms_with],
                    highs=[s[a][metric]["max"] for a in arms_with],
                    unit=unit,
                )
            )
        rr = s["ratio"]
        nf = (report.get("noise_floor") or {}).get("speed_ratio") or {}
        out.append(
            _table(
                [
                    [
                        k,
                        f"{r.get('better', '?')} is better",
                        fmt_ratio(r),
                        _verdict(r.get("verdict")),
                        fmt_ratio(nf.get(k)),
                    ]
                    for k, r in rr.items()
                ],
                ["measure", "direction", "patched/stock, 95% CI", "verdict", "noise floor stock/stock"],
            )
        )
        method = next((r.get("method") for r in rr.values() if r.get("method")), None)
        if method:
            out.append(
                f"<p class='muted'>Interval: {_e(method)}. A ratio whose interval spans 1.0 is inconclusive."
                "</p>"
            )
    pp = report.get("per_patch")
    if pp:
        labels = [p["patch"][:40] for p in pp]
        vals = [p.get("decode_ratio_vs_previous", {}).get("ratio", float("nan")) for p in pp]
        out.append(
            "<h2>Per-patch attribution</h2>"
            + bar_chart(
                "decode tok/s ratio vs the previous prefix",
                labels,
                vals,
                lows=[p.get("decode_ratio_vs_previous", {}).get("ci_low") for p in pp],
                highs=[p.get("decode_ratio_vs_previous", {}).get("ci_high") for p in pp],
                ref=1.0,
            )
        )
        out.append(
            _table(
                [
                    [
                        p["patch"],
                        p["numerics"],
                        p["greedy_identical_to_previous"],
                        (p.get("logits_vs_previous") or {}).get("max_abs_diff"),
                        (p.get("decode_ratio_vs_previous") or {}).get("ratio"),
                    ]
                    for p in pp
                ],
                ["patch", "numerics", "greedy identical to previous", "max |d logprob|", "decode ratio"],
            )
        )
    sf = report.get("surface")
    if sf:
        out.append(
            "<h2>Public surface (static drop-in check)</h2>"
            + _table(
                [
                    ["modules", sf["modules"]],
                    ["public symbols", sf["symbols"]],
                    ["entry points", sf["entry_points"]],
                    ["removed", ", ".join(sf["removed"]) or "none"],
                    [
                        "changed incompatibly",
                        ", ".join(f"{c['symbol']} ({c['why']})" for c in sf["changed"]) or "none",
                    ],
                    ["added", len(sf["added"])],
                ],
                ["measure", "value"],
            )
        )
    out.append(sampling_section(report.get("sampling")))
    fb = report.get("fallback")
    if fb:
        out.append(
            "<h2>Patch-level differential tests</h2>"
            + _table([[k, v] for k, v in fb.items()], ["key", "value"])
        )
    out.append("</body></html>\n")
    return "".join(out)


def render_endpoints(report: dict[str, Any]) -> str:
    """The `overlay check --endpoints` report as one self-contained page."""
    v = report.get("verdict", "?")
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>overlay check --endpoints</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>overlay check --endpoints <span class='badge {_e(v)}'>{_e(v.upper())}</span></h1>",
        f"<div class='muted'>{_e(report.get('created', ''))}</div>",
        "<h2>Servers</h2>"
        + _table([[k, s["url"], s["model"]] for k, s in report["servers"].items()], ["arm", "url", "model"]),
    ]
    out += [f"<p class='muted'>Note: {_e(n)}</p>" for n in report.get("notes", [])]
    out.append(
        "<h2>Gates</h2>"
        + _table(
            [[g["gate"], _verdict(g["status"]), g["detail"]] for g in report["gates"]],
            ["gate", "result", "detail"],
        )
    )
    out.append(context_section(report))
    ident = report["identity"]
    out.append(
        "<h2>Greedy identity (temperature 0)</h2>"
        + _table(
            [
                [
                    r["prompt"],
                    r["category"],
                    r["identical"],
                    r.get("logprob_max_abs_diff"),
                    r.get("error") or "",
                ]
                for r in ident["rows"]
            ],
            ["prompt", "category", "identical", "max |d logprob|", "error"],
        )
    )
    ld = report["load"]
    rows = []
    for arm, a in ld["arms"].items():
        for metric in ("ttft_s", "itl_s", "output_tok_s"):
            m = a[metric]
            rows.append([arm, metric, m["n"], m["p50"], m["p90"], m["p99"]])
    out.append(
        f"<h2>Load ({ld['concurrency']} in flight, {ld['rounds']} rounds per arm, arms alternating)</h2>"
        + _table(rows, ["arm", "metric", "n", "p50", "p90", "p99"])
    )
    out.append(
        _table(
            [
                [k, f"{r['better']} is better", fmt_ratio(r), _verdict(r["verdict"])]
                for k, r in ld["ratio"].items()
            ],
            ["measure", "direction", "patched/stock, 95% CI", "verdict"],
        )
    )
    for metric in ("output_tok_s", "ttft_s"):
        labels = [a for a in ld["arms"] if ld["arms"][a][metric]["p50"] is not None]
        if labels:
            out.append(
                bar_chart(
                    f"{metric} per arm (p50, whiskers p50-p90)",
                    labels,
                    [ld["arms"][a][metric]["p50"] for a in labels],
                    lows=[ld["arms"][a][metric]["p50"] for a in labels],
                    highs=[ld["arms"][a][metric]["p90"] for a in labels],
                )
            )
    out.append("</body></html>\n")
    return "".join(out)
