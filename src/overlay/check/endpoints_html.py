"""The `overlay check --endpoints` report as one self-contained HTML page (inline CSS and SVG; no network assets)."""

from __future__ import annotations

from typing import Any

from overlay.check.html_parts import CSS, bar_chart, context_section, esc, table, verdict_span
from overlay.check.stats import fmt_ratio


def render_endpoints(report: dict[str, Any]) -> str:
    """The `overlay check --endpoints` report as one self-contained page."""
    v = report.get("verdict", "?")
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>overlay check --endpoints</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>overlay check --endpoints <span class='badge {esc(v)}'>{esc(v.upper())}</span></h1>",
        f"<div class='muted'>{esc(report.get('created', ''))}</div>",
        "<h2>Servers</h2>"
        + table([[k, s["url"], s["model"]] for k, s in report["servers"].items()], ["arm", "url", "model"]),
    ]
    out += [f"<p class='muted'>Note: {esc(n)}</p>" for n in report.get("notes", [])]
    out.append(
        "<h2>Gates</h2>"
        + table(
            [[g["gate"], verdict_span(g["status"]), g["detail"]] for g in report["gates"]],
            ["gate", "result", "detail"],
        )
    )
    out.append(context_section(report))
    ident = report["identity"]
    out.append(
        "<h2>Greedy identity (temperature 0)</h2>"
        + table(
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
        + table(rows, ["arm", "metric", "n", "p50", "p90", "p99"])
    )
    out.append(
        table(
            [
                [k, f"{r['better']} is better", fmt_ratio(r), verdict_span(r["verdict"])]
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
