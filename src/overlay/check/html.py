"""The check report as one self-contained HTML page (inline CSS and SVG plots; no network assets). The building
blocks are overlay.check.html_parts; the `--endpoints` page is overlay.check.endpoints_html."""

from __future__ import annotations

import json
from typing import Any

from overlay.check import sampling
from overlay.check.census_report import top_primitives_diff, top_sites_diff
from overlay.check.html_parts import (
    CSS,
    Raw,
    bar_chart,
    context_section,
    esc,
    histogram_svg,
    table,
    verdict_span,
)
from overlay.check.stats import fmt_ratio


def _mechanism_section(report: dict[str, Any]) -> str:
    """The census table (one row per declared mechanism) and, per record, the sites that moved most."""
    records = report.get("mechanism")
    if records is None:
        return ""
    ms = report.get("mechanism_summary") or {}
    verdict = {True: ("pass", "holds"), False: ("fail", "DOES NOT HOLD"), None: ("muted", "not measured")}
    head = (
        f"<h2>Mechanism census</h2><p class='muted'>{esc(ms.get('declared', len(records)))} declared, "
        f"{esc(ms.get('hold', 0))} hold, {esc(ms.get('do_not_hold', 0))} do not hold, "
        f"{esc(ms.get('not_measured', 0))} not measured; per step, {esc(ms.get('steps', '?'))} steps per run"
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
            Raw(f"<span class='{verdict[r['holds']][0]}'>{verdict[r['holds']][1]}</span>"),
            r.get("note") or "",
        ]
        for r in records
    ]
    out = [head, table(rows, ["patch", "declared", "flag", "stock", "patched", "flag off", "holds", "note"])]
    moved = []
    for r in records:
        diff, prims = top_sites_diff(r), top_primitives_diff(r)
        if diff or prims:
            moved.append(
                f"<h3>{esc(r['patch'])}: {esc(r['declared'])}</h3>"
                + (
                    table(
                        [[site, a, b, b - a] for site, a, b in diff],
                        ["site (per step)", "before", "after", "change"],
                    )
                    if diff
                    else ""
                )
                + (
                    table(
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


def sampling_section(sm: dict[str, Any] | None) -> str:
    if not sm:
        return ""
    worst = sm.get("worst") or {}
    return f"<h2>Sampling distribution at T={esc(sm['temperature'])}</h2>" + table(
        [
            ["prompts x seeds x positions", f"{sm['prompts']} x {sm['seeds']} x {sm['positions']}"],
            ["chi-square tests (informative)", sm["informative_tests"]],
            ["Bonferroni threshold", sm["threshold"]],
            [
                "lowest p",
                f"{sm['min_p']:.3g} (prompt {worst.get('prompt')}, position {worst.get('position')})",
            ],
            ["distributions equal", sm["equal"]],
            [sampling.identical_label(sm), f"{sm['identical_runs']}/{sm['runs']}"],
        ],
        ["measure", "value"],
    )


def render(report: dict[str, Any]) -> str:
    v = report.get("verdict", "?")
    out = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>overlay check {esc(report['engine'])}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>overlay check: {esc(report['engine'])} <span class='badge {esc(v)}'>{esc(v.upper())}</span></h1>",
        (
            f"<div class='muted'>{esc(report.get('created', ''))} &middot; mode {esc(report.get('mode'))} &middot; "
            f"series class <b>{esc(report['series']['class'])}</b> &middot; gate class "
            f"<b>{esc(report['series'].get('gate_class', report['series']['class']))}</b> &middot; "
            f"{len(report['series']['patches'])} patches</div>"
        ),
    ]
    arms = report["arms"]
    out.append(
        "<h2>Arms</h2>"
        + table([[k, a["wheel"], a["version"]] for k, a in arms.items()], ["arm", "wheel", "version"])
    )
    if report.get("model"):
        m = report["model"]
        out.append(
            f"<p>Model: <code>{esc(m.get('kind') or m['path'])}</code>; real drafter: "
            f"<code>{esc(m.get('draft_kind') or m.get('draft'))}</code></p>"
        )
    for note in report.get("notes", []):
        out.append(f"<p class='muted'>Note: {esc(note)}</p>")
    out.append(
        "<h2>Gates</h2>"
        + table(
            [
                [
                    g["subject"],
                    g["class"],
                    g["gate"],
                    verdict_span(g.get("status") or ("pass" if g["passed"] else "fail")),
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
        + table(
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
            + table(
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
            + table(
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
        for label in ("self", "never", "real", "mtp", "ngram"):
            if label in sp:
                for arm in ("stock", "patched"):
                    s = sp[label][arm]
                    if "error" in s:  # the arm's engine could not run this draft (steps.spec_protocol)
                        rows.append([label, arm, f"failed: {s['error'][-200:]}", "", "", "", ""])
                        continue
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
            f"<h2>Speculative decoding (k={esc(sp['k'])})</h2>"
            + table(
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
            table(
                [
                    [
                        k,
                        f"{r.get('better', '?')} is better",
                        fmt_ratio(r),
                        verdict_span(r.get("verdict")),
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
                f"<p class='muted'>Interval: {esc(method)}. A ratio whose interval spans 1.0 is inconclusive."
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
            table(
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
            + table(
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
            + table([[k, v] for k, v in fb.items()], ["key", "value"])
        )
    out.append("</body></html>\n")
    return "".join(out)
