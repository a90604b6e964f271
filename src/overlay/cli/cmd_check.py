"""overlay check ENGINE: the patched engine against the stock one, side by side (greedy, logits, speculation, speed)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = ("check the patched engine against the stock one: outputs, logits, speculation, speed, each patch's mechanism "
        "(exit 4 on a failed gate)")
EXAMPLE = "overlay check mlx-lm --reps 5"


def configure_parser(sub: Any) -> None:
    p = sub.add_parser("check", help=HELP, description=f"{HELP}.\n\nexample: {EXAMPLE}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("engine", help="engine name (overlays/ENGINE.toml)")
    p.add_argument("--model", type=Path, help="a real checkpoint folder (default: a bundled tiny model)")
    p.add_argument("--draft", type=Path, help="a drafter checkpoint for the 'real draft' run (default: bundled)")
    p.add_argument("--target-kind", help="bundled target model kind (see `overlay models list`)")
    p.add_argument("--draft-kind", help="bundled drafter kind")
    p.add_argument("--per-patch", action="store_true",
                   help="also build the cumulative prefixes (1..N patches) and attribute speed and outputs to each patch")
    p.add_argument("--reps", type=int, default=5, help="speed repetitions per arm, interleaved (default 5)")
    p.add_argument("--positions", type=int, default=50_000, help="teacher-forced positions (default 50000)")
    p.add_argument("--allow-few-positions", action="store_true", help="accept --positions below 50000")
    p.add_argument("--max-tokens", type=int, default=48, help="greedy tokens per prompt (default 48)")
    p.add_argument("--num-draft", type=int, default=3, help="draft tokens per speculative cycle (default 3)")
    p.add_argument("--mechanism", action="store_true",
                   help="run only the mechanism census: each patch's Overlay-Mechanism counted stock vs patched "
                        "(minutes; exit 4 when a declared mechanism does not hold)")
    p.add_argument("--patch", metavar="NAME", help="census only this patch's declared mechanisms")
    p.add_argument("--gate-mechanism", action=argparse.BooleanOptionalAction, default=None,
                   help="fail the check (exit 4) when a declared mechanism does not hold (default: on with "
                        "--mechanism, off in the full check, which reports them)")
    p.add_argument("--census-steps", type=int, default=4, help="steps (tokens, rounds, chunks) per census run (default 4)")
    p.add_argument("--min-speedup", type=float, help="gate: the decode speedup's 95%% CI low end must reach this")
    p.add_argument("--json", dest="json_path", type=Path, help="report path (default build/reports/ENGINE-check.json)")
    p.add_argument("--html", dest="html_path", type=Path, help="HTML report (default build/reports/ENGINE-check.html)")
    p.add_argument("--print-json", action="store_true", help="print the report JSON on stdout instead of the table")
    p.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> int:
    from overlay.core.extras import require_extra

    require_extra("check", command="check")  # before overlay.check imports numpy
    from overlay.check.run import CheckOptions, run_check
    from overlay.engines import get_adapter
    from overlay.errors import CheckFailed

    root = resolve_root(args)
    options = CheckOptions(
        engine=args.engine, model=args.model.resolve() if args.model else None,
        draft=args.draft.resolve() if args.draft else None, per_patch=args.per_patch, reps=args.reps,
        positions=args.positions, max_tokens=args.max_tokens, num_draft=args.num_draft,
        json_path=args.json_path.resolve() if args.json_path else None,
        html_path=args.html_path.resolve() if args.html_path else None, min_speedup=args.min_speedup,
        allow_few_positions=args.allow_few_positions, target_kind=args.target_kind, draft_kind=args.draft_kind,
        mechanism=args.mechanism, patch=args.patch, census_steps=args.census_steps,
        gate_mechanism=args.gate_mechanism,
    )
    try:
        report = run_check(root=root, options=options, adapter=get_adapter(options.engine), reporter=reporter_for(args))
    except CheckFailed as exc:
        failed_report = getattr(exc, "report", None)
        if failed_report is not None:
            _show(failed_report, args)
        raise
    _show(report, args)
    return 0


def _show(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.print_json:
        emit_json({k: v for k, v in report.items() if not k.startswith("_")})
        return
    for line in table_lines(report):
        print(line)


def table_lines(report: dict[str, Any]) -> list[str]:
    lines = [(f"overlay check {report['engine']}: {report['verdict'].upper()}  "
             f"(stock {report['arms']['stock']['version']} vs patched {report['arms']['patched']['version']}, "
             f"series class {report['series']['class']})")]
    for note in report.get("notes", []):
        lines.append(f"note: {note}")
    g = report.get("greedy")
    if g:
        fd = g["first_divergence"]
        lines.append(f"greedy     {g['identical_count']}/{g['prompts']} prompts identical"
                     + ("" if not fd else f"; first divergence prompt {fd['prompt']} ({fd['category']}) at token "
                        f"{fd['position']}, stock margin {fd['logit_margin']:.3g}")
                     + f"; logprobs max |d| {g['logprobs_max_abs_diff']:.3g}")
    lg = report.get("logits")
    if lg and lg.get("positions"):
        lines.append(f"logits     {lg['positions']} positions: KLD {lg['kld_mean']:.3g} +/- {lg['kld_se']:.2g}, "
                     f"top-1 {lg['top1_agreement']:.5f}, dNLL {lg['dnll']:.3g} +/- {lg['dnll_se']:.2g}, "
                     f"bit-identical {'yes' if lg['bit_identical'] else 'no'}")
    sp = report.get("speculative")
    if sp:
        for label in ("self", "never", "real"):
            if label in sp:
                s, p = sp[label]["stock"], sp[label]["patched"]
                lines.append(f"spec {label:<5} k={sp['k']}: acceptance stock {s['acceptance_rate']:.3f} (AL "
                             f"{s['acceptance_length']:.2f}) patched {p['acceptance_rate']:.3f} (AL {p['acceptance_length']:.2f})"
                             f"; patched identical to serial: {sp[label].get('patched_identical_to_serial')}")
                if p.get("counters") != "engine" and "engine" in p:
                    e = p["engine"]
                    lines.append(f"           (both from from_draft flags; patched engine counters: rate "
                                 f"{e['acceptance_rate']:.3f}, AL {e['acceptance_length']:.2f})")
    s = report.get("speed")
    if s:
        for metric, key in (("decode", "decode_tok_s"), ("decode_cpu", "decode_cpu_tok_s"), ("prefill", "prefill_tok_s"),
                            ("cold_start", "cold_start_s")):
            if key in s["stock"]:
                r = s["ratio"].get(metric)
                nf = ((report.get("noise_floor") or {}).get("speed_ratio") or {}).get(metric)
                lines.append(f"{metric:<10} stock {s['stock'][key]['median']:.4g} patched {s['patched'][key]['median']:.4g}"
                             f"  ratio {r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
                             + (f"  noise floor {nf['ratio']:.3f} [{nf['ci_low']:.3f}, {nf['ci_high']:.3f}]" if nf else ""))
    from overlay.check.census import line as census_line

    for rec in report.get("mechanism") or []:
        lines.append(census_line(rec))
    ms = report.get("mechanism_summary")
    if ms:
        lines.append(f"mechanism: {ms['declared']} declared, {ms['hold']} hold, {ms['do_not_hold']} do not hold, "
                     f"{ms['not_measured']} not measured" + ("" if ms["gated"] or not ms["do_not_hold"] else
                                                              " (NOT GATED in this run)"))
    sf = report.get("surface")
    if sf:
        lines.append(f"surface    {sf['modules']} modules, {sf['symbols']} public symbols: {len(sf['removed'])} removed, "
                     f"{len(sf['changed'])} changed incompatibly, {len(sf['added'])} added")
    for gate in report.get("gates", []):
        lines.append(f"gate {'pass' if gate['passed'] else 'FAIL'}  {gate['subject']} [{gate['class']}] {gate['gate']}: {gate['detail']}")
    paths = report.get("_paths", {})
    if paths:
        lines.append(f"report     {paths.get('json')}  {paths.get('html')}")
    return lines
