"""overlay check ENGINE: the patched engine against the stock one, side by side (greedy, logits, speculation, speed)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from overlay.cli.common import add_command, resolve_root, resolved
from overlay.cli.output import emit_json, reporter_for

HELP = (
    "check the patched engine against the stock one: outputs, logits, speculation, speed, each patch's mechanism, "
    "on your flags, prompts and wheels, or two live servers (exit 4 on a failed or inconclusive gate)"
)
EXAMPLE = (
    "overlay check mlx-lm --flags all --temperature 0.7\n"
    "         overlay check --endpoints http://127.0.0.1:8000 http://127.0.0.1:8001 --requests 32"
)


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "check", HELP, EXAMPLE, execute)
    p.add_argument("engine", nargs="?", help="engine name (overlays/ENGINE.toml); omitted with --endpoints")
    p.add_argument(
        "--model",
        help="a real checkpoint folder (default: a bundled tiny model); with --endpoints, the "
        "served model name (default: each server's first in /v1/models)",
    )
    p.add_argument(
        "--draft", type=Path, help="a drafter checkpoint for the 'real draft' run (default: bundled)"
    )
    p.add_argument("--target-kind", help="bundled target model kind (see `overlay models list`)")
    p.add_argument("--draft-kind", help="bundled drafter kind")
    p.add_argument(
        "--per-patch",
        action="store_true",
        help="also build the cumulative prefixes (1..N patches) and attribute speed and outputs to each patch",
    )
    p.add_argument("--reps", type=int, default=5, help="speed repetitions per arm, interleaved (default 5)")
    p.add_argument("--positions", type=int, default=50_000, help="teacher-forced positions (default 50000)")
    p.add_argument("--allow-few-positions", action="store_true", help="accept --positions below 50000")
    p.add_argument("--max-tokens", type=int, default=48, help="greedy tokens per prompt (default 48)")
    p.add_argument("--num-draft", type=int, default=3, help="draft tokens per speculative cycle (default 3)")
    p.add_argument(
        "--mechanism",
        action="store_true",
        help="run only the mechanism census: each patch's Overlay-Mechanism counted stock vs patched "
        "(minutes; exit 4 when a declared mechanism does not hold)",
    )
    p.add_argument("--patch", metavar="NAME", help="census only this patch's declared mechanisms")
    p.add_argument(
        "--gate-mechanism",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fail the check (exit 4) when a declared mechanism does not hold (default: on; "
        "--no-gate-mechanism reports them without failing, and the report says so)",
    )
    p.add_argument(
        "--flags",
        default="none",
        metavar="all|none|NAME,...",
        help="the patches' Overlay-Flag values to set in the patched arm (env vars; CLI options as task "
        "options): all, none (default) or names (MLX_LM_FUSED_PROJ, --keep-mtp); the gate class comes "
        "from the patches they make active",
    )
    p.add_argument(
        "--prompts",
        dest="prompts_file",
        type=Path,
        metavar="FILE",
        help='your prompts, JSONL: {"text": ...} or {"messages": [{"role", "content"}]} a line, optional '
        '"category" (default: the built-in set)',
    )
    p.add_argument(
        "--corpus",
        dest="corpus_file",
        type=Path,
        metavar="FILE",
        help="text for the teacher-forced pass: plain text (documents split on blank lines) or .jsonl "
        '{"text": ...} (default: the built-in corpus)',
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="also sample at this temperature over many seeds and test, per position, that the patched "
        "token distribution equals stock's (chi-square; gated for exact and lossless patches)",
    )
    p.add_argument(
        "--samples", type=int, default=200, help="seeds per prompt for --temperature (default 200)"
    )
    p.add_argument(
        "--stock-wheel", type=Path, metavar="WHEEL", help="check this stock wheel instead of the pinned one"
    )
    p.add_argument(
        "--patched-wheel",
        type=Path,
        metavar="WHEEL",
        help="check this overlay-built wheel (the one you deploy) instead of building one",
    )
    p.add_argument(
        "--endpoints",
        nargs=2,
        metavar=("STOCK_URL", "PATCHED_URL"),
        help="check two running OpenAI-compatible servers instead of an engine: greedy identity per "
        "prompt, logprob agreement, TTFT, inter-token latency, tok/s under bounded load",
    )
    p.add_argument(
        "--concurrency", type=int, default=4, help="with --endpoints: requests in flight per arm (default 4)"
    )
    p.add_argument(
        "--requests", type=int, default=32, help="with --endpoints: load requests per arm (default 32)"
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=600.0,
        help="with --endpoints: stop the load phase after this many seconds (default 600)",
    )
    p.add_argument(
        "--census-steps",
        type=int,
        default=4,
        help="steps (tokens, rounds, chunks) per census run (default 4)",
    )
    p.add_argument(
        "--min-speedup", type=float, help="gate: the decode speedup's 95%% CI low end must reach this"
    )
    p.add_argument(
        "--json", dest="json_path", type=Path, help="report path (default build/reports/ENGINE-check.json)"
    )
    p.add_argument(
        "--html", dest="html_path", type=Path, help="HTML report (default build/reports/ENGINE-check.html)"
    )
    p.add_argument(
        "--print-json", action="store_true", help="print the report JSON on stdout instead of the table"
    )


def execute(args: argparse.Namespace) -> int:
    from overlay.core.extras import require_extra

    require_extra("check", command="check")  # before overlay.check imports numpy
    from overlay.check.options import CheckOptions
    from overlay.check.run import run_check
    from overlay.core.manifest import load_engine
    from overlay.engines import get_adapter
    from overlay.errors import UsageError

    root = resolve_root(args)
    if args.endpoints:
        return _endpoints(args, root)
    if not args.engine:
        raise UsageError(
            "overlay check needs an ENGINE (or --endpoints STOCK_URL PATCHED_URL)",
            tip="e.g. `overlay check mlx-lm`; `overlay list` shows the engines",
        )
    options = CheckOptions(
        engine=args.engine,
        model=Path(args.model).resolve() if args.model else None,
        draft=resolved(args.draft),
        per_patch=args.per_patch,
        reps=args.reps,
        positions=args.positions,
        max_tokens=args.max_tokens,
        num_draft=args.num_draft,
        json_path=resolved(args.json_path),
        html_path=resolved(args.html_path),
        min_speedup=args.min_speedup,
        allow_few_positions=args.allow_few_positions,
        target_kind=args.target_kind,
        draft_kind=args.draft_kind,
        mechanism=args.mechanism,
        patch=args.patch,
        census_steps=args.census_steps,
        gate_mechanism=args.gate_mechanism,
        flags=args.flags,
        prompts_file=resolved(args.prompts_file),
        corpus_file=resolved(args.corpus_file),
        temperature=args.temperature,
        samples=args.samples,
        stock_wheel=resolved(args.stock_wheel),
        patched_wheel=resolved(args.patched_wheel),
    )
    # the engine's name and manifest first: a path or an unknown name is refused here
    load_engine(root, options.engine)
    return _run_and_show(
        lambda: run_check(
            root=root, options=options, adapter=get_adapter(options.engine), reporter=reporter_for(args)
        ),
        args,
        table_lines,
    )


def _endpoints(args: argparse.Namespace, root: Path) -> int:
    from overlay.check.endpoints import EndpointOptions, run_endpoints
    from overlay.check.endpoints_report import endpoint_lines
    from overlay.errors import UsageError

    if args.engine:
        raise UsageError(
            f"--endpoints checks two servers; drop the ENGINE argument ({args.engine!r})",
            tip="overlay check --endpoints STOCK_URL PATCHED_URL",
        )
    options = EndpointOptions(
        stock_url=args.endpoints[0],
        patched_url=args.endpoints[1],
        model=args.model,
        prompts_file=resolved(args.prompts_file),
        concurrency=args.concurrency,
        requests=args.requests,
        max_tokens=args.max_tokens,
        time_limit_s=args.time_limit,
        json_path=resolved(args.json_path),
        html_path=resolved(args.html_path),
    )
    return _run_and_show(
        lambda: run_endpoints(root=root, options=options, reporter=reporter_for(args)), args, endpoint_lines
    )


def _run_and_show(
    run: Callable[[], dict[str, Any]],
    args: argparse.Namespace,
    lines_of: Callable[[dict[str, Any]], list[str]],
) -> int:
    """Run the check and show its report (also the report a failed gate carries, before the error is raised)."""
    from overlay.errors import CheckFailed

    try:
        report = run()
    except CheckFailed as exc:
        failed = getattr(exc, "report", None)
        if failed is not None:
            _show(failed, args, lines_of)
        raise
    _show(report, args, lines_of)
    return 0


def _show(
    report: dict[str, Any], args: argparse.Namespace, lines_of: Callable[[dict[str, Any]], list[str]]
) -> None:
    """``--print-json``: the report (less its ``_`` keys) as JSON; otherwise its lines."""
    if args.print_json:
        emit_json({k: v for k, v in report.items() if not k.startswith("_")})
        return
    for line in lines_of(report):
        print(line)


def table_lines(report: dict[str, Any]) -> list[str]:
    from overlay.check.stats import fmt_ratio

    lines = [
        (
            f"overlay check {report['engine']}: {report['verdict'].upper()}  "
            f"(stock {report['arms']['stock']['version']} vs patched {report['arms']['patched']['version']}, "
            f"series class {report['series']['class']}, gate class "
            f"{report['series'].get('gate_class', report['series']['class'])})"
        )
    ]
    host = report.get("host")
    if host:
        versions = ", ".join(f"{k} {v}" for k, v in ((host.get("versions") or {}).get("stock") or {}).items())
        lines.append(
            f"host       {host.get('cpu_model')}, {host.get('cores')} cores ({host.get('cores_usable')} usable), "
            f"load {host.get('load_average_start')} -> {host.get('load_average_end')}; {versions}"
        )
    fl = report.get("flags")
    if fl:
        lines.append(
            f"flags      {fl['requested']}: set {', '.join(fl['set']) or 'none'}; {len(fl['active_patches'])} "
            f"patches active ({len(fl.get('exercised_patches', fl['active_patches']))} exercised by the comparisons), "
            f"{len(fl['inactive_patches'])} off"
        )
    for note in report.get("notes", []):
        lines.append(f"note: {note}")
    g = report.get("greedy")
    if g:
        fd = g["first_divergence"]
        lines.append(
            f"greedy     {g['identical_count']}/{g['prompts']} prompts identical"
            + (
                ""
                if not fd
                else f"; first divergence prompt {fd['prompt']} ({fd['category']}) at token "
                f"{fd['position']}, stock margin {fd['logit_margin']:.3g}"
            )
            + f"; logprobs max |d| {g['logprobs_max_abs_diff']:.3g}"
        )
    lg = report.get("logits")
    if lg and lg.get("positions"):
        lines.append(
            f"logits     {lg['positions']} positions: KLD {lg['kld_mean']:.3g} +/- {lg['kld_se']:.2g}, "
            f"top-1 {lg['top1_agreement']:.5f}, dNLL {lg['dnll']:.3g} +/- {lg['dnll_se']:.2g}, "
            f"bit-identical {'yes' if lg['bit_identical'] else 'no'}"
        )
    sp = report.get("speculative")
    if sp:
        for label in ("self", "never", "real", "mtp", "ngram"):
            if label in sp:
                s, p = sp[label]["stock"], sp[label]["patched"]
                if (
                    "error" in s or "error" in p
                ):  # a draft an arm's engine could not run (steps.spec_protocol)
                    lines.append(
                        f"spec {label:<5} k={sp['k']}: "
                        + "; ".join(
                            f"{arm} failed: {r['error'][-160:]}"
                            if "error" in r
                            else f"{arm} acceptance {r['acceptance_rate']:.3f} (AL {r['acceptance_length']:.2f})"
                            for arm, r in (("stock", s), ("patched", p))
                        )
                        + f"; patched identical to serial: {sp[label].get('patched_identical_to_serial')}"
                    )
                    continue
                lines.append(
                    f"spec {label:<5} k={sp['k']}: acceptance stock {s['acceptance_rate']:.3f} (AL "
                    f"{s['acceptance_length']:.2f}) patched {p['acceptance_rate']:.3f} (AL {p['acceptance_length']:.2f})"
                    f"; patched identical to serial: {sp[label].get('patched_identical_to_serial')}"
                )
                if p.get("counters") != "engine" and "engine" in p:
                    e = p["engine"]
                    lines.append(
                        f"           (both from from_draft flags; patched engine counters: rate "
                        f"{e['acceptance_rate']:.3f}, AL {e['acceptance_length']:.2f})"
                    )
    s = report.get("speed")
    if s:
        for metric, key in (
            ("decode", "decode_tok_s"),
            ("decode_cpu", "decode_cpu_tok_s"),
            ("prefill", "prefill_tok_s"),
            ("cold_start", "cold_start_s"),
        ):
            r = s["ratio"].get(metric)
            if key in s["stock"] and r:
                nf = ((report.get("noise_floor") or {}).get("speed_ratio") or {}).get(metric)
                lines.append(
                    f"{metric:<10} stock {s['stock'][key]['median']:.4g} patched {s['patched'][key]['median']:.4g}"
                    f" ({r.get('better', '?')} is better)  ratio {fmt_ratio(r)} {r.get('verdict', '?')}"
                    + (f"  noise floor {fmt_ratio(nf)}" if nf else "")
                )
    sm = report.get("sampling")
    if sm:
        lines.append(
            f"sampling   T={sm['temperature']:g}: {sm['informative_tests']} chi-square tests over {sm['seeds']} "
            f"seeds, lowest p {sm['min_p']:.3g} (threshold {sm['threshold']:.2g}): "
            f"{'equal' if sm['equal'] else 'DIFFERENT'}; {sm['identical_runs']}/{sm['runs']} runs identical"
        )
    from overlay.check.census_report import line as census_line

    for rec in report.get("mechanism") or []:
        lines.append(census_line(rec))
    ms = report.get("mechanism_summary")
    if ms:
        lines.append(
            f"mechanism: {ms['declared']} declared, {ms['hold']} hold, {ms['do_not_hold']} do not hold, "
            f"{ms['not_measured']} not measured"
            + ("" if ms["gated"] or not ms["do_not_hold"] else " (NOT GATED in this run)")
        )
    sf = report.get("surface")
    if sf:
        lines.append(
            f"surface    {sf['modules']} modules, {sf['symbols']} public symbols: {len(sf['removed'])} removed, "
            f"{len(sf['changed'])} changed incompatibly, {len(sf['added'])} added"
        )
    for gate in report.get("gates", []):
        status = gate.get("status") or ("pass" if gate["passed"] else "fail")
        lines.append(
            f"gate {status if status != 'fail' else 'FAIL'}  {gate['subject']} [{gate['class']}] {gate['gate']}: {gate['detail']}"
        )
    paths = report.get("_paths", {})
    if paths:
        lines.append(f"report     {paths.get('json')}  {paths.get('html')}")
    return lines
