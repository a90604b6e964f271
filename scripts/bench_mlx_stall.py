#!/usr/bin/env python3
"""Benchmark: adaptive speculative decoding in mlx-lm when one verify cycle stalls, the series before and with 0029.

    .venv/bin/python scripts/bench_mlx_stall.py [--reps N] [--tokens N] [--stall-seconds S] [--json FILE]

Both arms are the patched mlx-lm: the series up to 0028 (SpeculativeController as 0021 and 0028 left it) and the
whole series (0029: a cycle whose target part took longer than its tokens as serial steps and than twice the
predicted verify is a stall, its time left out). The pair is the bench's ``heavy+draft`` (scripts/bench_mlx.py:
``llama-heavy`` with the trained ``llama-draft``, where drafting pays), greedy, k = 3, the bench's four prompts x
``--tokens`` tokens. A stall is a sleep of ``--stall-seconds`` in the target's forward of the first verify cycle of each
generation (tests/engines/mlx_lm/probes/spec_stall.py), as a burst of other load adds to one cycle; "none" runs
without it. Per repetition each arm runs every prompt in a fresh process, the two in alternating order. Reported per
case: the share of tokens from serial steps, the verify cycles and stalls per generation, and generation tok/s (tokens
/ wall seconds of the whole generation, the stall included) with the whole series over the series up to 0028 as a
95 % paired log-ratio t-interval over every prompt of every repetition (overlay.check.stats.ratio_ci); an interval that
spans 1.0 is not a speedup. Every output must equal ``generate_step``'s greedy tokens. Writes a JSON report (default
build/reports/mlx-stall-bench.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from bench_mlx import CATEGORIES  # the bench's prompts (this script's folder is on sys.path)

from overlay.check import models as tinymodels
from overlay.check.envs import arms_for
from overlay.check.stats import fmt_ratio, ratio_ci, speed_verdict
from overlay.fsutil import atomic_write_json
from overlay.paths import layout

PROBE = REPO / "tests" / "engines" / "mlx_lm" / "probes" / "spec_stall.py"
BEFORE = 28  # the series up to 0028: the controller before 0029


def run(args: argparse.Namespace) -> dict[str, Any]:
    arms = {"0028": arms_for(REPO, "mlx-lm", upto=BEFORE).patched, "series": arms_for(REPO, "mlx-lm").patched}
    python = arms["series"].python
    target = str(tinymodels.build("llama-heavy", root=REPO, python=python))
    draft = str(tinymodels.build("llama-draft", root=REPO, python=python))
    prompts = [tinymodels.PROMPTS[c][0] for c in CATEGORIES]
    cases = {"none": -1, "stall": 0}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {a: [] for a in arms} for c in cases}
    identical = True
    load = [os.getloadavg()[0]]
    for rep in range(args.reps):
        order = list(arms) if rep % 2 == 0 else list(arms)[::-1]
        for case, cycle in cases.items():
            for a in order:
                payload = {
                    "target": target,
                    "draft": draft,
                    "prompts": prompts,
                    "max_tokens": args.tokens,
                    "k": 3,
                    "stall_cycle": cycle,
                    "stall_seconds": args.stall_seconds,
                }
                r = arms[a].run_json(PROBE, payload)
                identical &= all(x["tokens"] == s for x, s in zip(r["runs"], r["serial_tokens"], strict=True))
                runs[case][a] += r["runs"]
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    load.append(os.getloadavg()[0])
    rows = []
    for case in cases:
        per = {}
        for a in arms:
            rs = runs[case][a]
            per[a] = {
                "serial_share": sum(x["serial"] for x in rs) / sum(len(x["tokens"]) for x in rs),
                "cycles": statistics.median(x["cycles"] for x in rs),
                "stalls": statistics.median(x["stalls"] or 0 for x in rs),
                "tok_s": statistics.median(len(x["tokens"]) / x["seconds"] for x in rs),
            }
        rate = {a: [len(x["tokens"]) / x["seconds"] for x in runs[case][a]] for a in arms}
        ratio = ratio_ci(rate["series"], rate["0028"])
        rows.append(
            {
                "case": case,
                "arms": per,
                "ratio": ratio,
                "verdict": speed_verdict(ratio, higher_is_better=True),
            }
        )
    return {
        "version": 1,
        "pair": "heavy+draft (llama-heavy, llama-draft), k 3, greedy",
        "arms": {a: arm.version for a, arm in arms.items()},
        "reps": args.reps,
        "tokens": args.tokens,
        "stall_seconds": args.stall_seconds,
        "load_average": load,
        "identical": identical,
        "cases": rows,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--stall-seconds", type=float, default=0.3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    report = run(args)
    out = args.json or layout(REPO).reports / "mlx-stall-bench.json"
    atomic_write_json(out, report)
    print(
        f"{report['pair']}, {report['reps']} reps x 4 prompts x {report['tokens']} tokens, stall "
        f"{report['stall_seconds']} s in the first verify, load {report['load_average'][0]:.2f} -> "
        f"{report['load_average'][1]:.2f}, outputs identical to serial greedy: {report['identical']}"
    )
    print("| case | arm | serial share | cycles / gen | stalls / gen | tok/s | series / 0028 [95 %] |")
    print("|---|---|---:|---:|---:|---:|---|")
    for row in report["cases"]:
        for a, v in row["arms"].items():
            tail = f"{fmt_ratio(row['ratio'], 2, 'x')} ({row['verdict']})" if a == "series" else ""
            print(
                f"| {row['case']} | {a} | {v['serial_share']:.2f} | {v['cycles']:g} | {v['stalls']:g} | "
                f"{v['tok_s']:.1f} | {tail} |"
            )
    print(f"report: {out}")
    return 0 if report["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
