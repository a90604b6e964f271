#!/usr/bin/env python3
"""Benchmark: stock serial decoding vs patched speculative decoding in mlx-lm, side by side, in one run.

    .venv/bin/python scripts/bench_mlx.py [--reps N] [--tokens N] [--scenarios a,b] [--fixed] [--temp T] [--json FILE]

Scenarios (bundled tiny models, overlay.check.models, built locally and cached under build/models):

- ``heavy+draft`` (drafting pays): target ``llama-heavy`` (the trained ``llama-target`` plus dead layers: the same
  outputs at ~8x the cost of a step), drafter ``llama-draft`` (trained);
- ``heavy+mtp`` (drafting pays, no separate drafter): ``qwen3_5-mtp-heavy``, a hybrid Qwen3.5 whose MTP head was
  trained against it, drafting with ``--draft-kind mtp``;
- ``heavy+random`` (drafting cannot pay: the drafter is never right): ``llama-heavy`` with ``llama-draft-random``;
- ``cheap+random`` (drafting cannot pay, and a wasted cycle costs the most relative to a step): the cheap
  ``llama-target`` with ``llama-draft-random``.
- ``cheap+self`` (drafting cannot pay: the drafter costs a target step; every draft is right): ``llama-target``
  drafting for itself, the acceptance reference of a perfect drafter (1.00 at T = 0; with rejection sampling it
  stays there at T > 0, where exact-match acceptance fell to sum(p^2)).

Each scenario compares stock ``generate_step`` (serial greedy) with patched ``speculative_generate_step(...,
adaptive_draft=True, num_draft_tokens=3)`` on the same prompts (one per prompt category), and the patched wheel's own
serial decoding (the series' other patches make every step faster; "vs own" isolates what speculation adds);
``--fixed`` adds stock and patched speculation with a fixed draft length 3 (stock cannot draft with MTP or for a
hybrid target). Per repetition each arm runs in a fresh process (the venvs of the tests, OpenBLAS preloaded), the
two processes in alternating order, and a process runs its modes interleaved prompt by prompt, so "vs own"
(patched mode / patched serial) compares runs taken at nearly the same moment. Decode tok/s = (tokens - 1) /
seconds from the first token to the last, summed over the prompts of a measurement, in wall and in CPU time. The
table shows per config the median over repetitions and, against stock serial, the median (min-max) of the
per-repetition ratios; "identical" checks that every patched output equals stock serial greedy decoding, token for
token and byte for byte; "cycles/gen" counts the verify cycles each speculative generation drafted (the
generator's own statistics, not timed: median (min-max) over every prompt of every repetition). Targets: >= 1.5x
stock serial where drafting pays; where it cannot, >= 0.99x stock serial and >= 1.00x the patched serial decoding. Intervals: 95 % paired log-ratio t-intervals (overlay.check.stats.ratio_ci),
against stock serial over the repetitions (the two arms ran back to back), against the patched serial decoding over
every prompt of every repetition (the two modes ran one after the other in one process). The load average of the
machine is recorded before and after each scenario. Timings on a shared CPU are noisy: use several repetitions.
``--acceptance`` measures instead, in the patched arm, the acceptance of fixed-k speculation at T = 0 and at ``--temp``
(default 0.7) per reached draft position against its expectation ``sum(min(p, q))`` computed from the two
distributions the verify was given (probes/spec_acceptance.py), for the MTP head and the trained drafter. Writes a
JSON report
(default build/reports/mlx-spec-bench.json). ``--temp T`` (T > 0) samples instead (``make_sampler(T)``, one seed per
prompt): outputs are then distributed as serial sampling rather than identical, so "identical" is not required, and
the acceptance at T can be set against the greedy run's (patch 0025: rejection sampling keeps it close).
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

from overlay.check.envs import Arm, arms_for
from overlay.fsutil import atomic_write_text

PROBE = REPO / "tests" / "engines" / "mlx_lm" / "probes" / "spec_bench.py"
ACCEPTANCE = REPO / "tests" / "engines" / "mlx_lm" / "probes" / "spec_acceptance.py"
SCENARIOS: dict[str, dict[str, Any]] = {
    "heavy+draft": {"target": "llama-heavy", "draft": "llama-draft", "kind": "model", "pays": True},
    "heavy+mtp": {"target": "qwen3_5-mtp-heavy", "draft": None, "kind": "mtp", "pays": True},
    "heavy+random": {"target": "llama-heavy", "draft": "llama-draft-random", "kind": "model", "pays": False},
    "cheap+random": {"target": "llama-target", "draft": "llama-draft-random", "kind": "model", "pays": False},
    "cheap+self": {"target": "llama-target", "draft": "llama-target", "kind": "model", "pays": False},
}
CATEGORIES = ("code", "prose", "json", "repetitive")
K = 3
TARGET_PAYS, TARGET_CANNOT, TARGET_OWN = 1.5, 0.99, 1.00
# --acceptance: the MTP head (on the cheap qwen3_5-mtp: the same logits as qwen3_5-mtp-heavy) and the trained drafter.
ACCEPTANCE_PAIRS = {"mtp": ("qwen3_5-mtp", None), "draft": ("llama-target", "llama-draft")}


def _modes(sc: dict[str, Any], fixed: bool) -> dict[str, list[str]]:
    """The modes each arm runs (in one process per repetition, interleaved prompt by prompt)."""
    modes = {"stock": ["serial"], "patched": ["serial", "adaptive"]}
    if fixed:
        if sc["kind"] == "model":
            modes["stock"].append("spec")
        modes["patched"].append("spec")
    return modes


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    n = sum(r["n"] - 1 for r in runs)
    out: dict[str, Any] = {
        "tok_s": n / sum(r["wall"] for r in runs),
        "cpu_tok_s": n / sum(r["cpu"] for r in runs),
        "per_prompt_tok_s": [(r["n"] - 1) / r["wall"] for r in runs],
        "per_prompt_cpu_tok_s": [(r["n"] - 1) / r["cpu"] for r in runs],
        "tokens": [r["tokens"] for r in runs],
        "text": [r["text"] for r in runs],
    }
    stats = [r["stats"] for r in runs if r.get("stats")]
    if stats:
        acc, dr, cyc = (sum(s[k] for s in stats) for k in ("accepted", "drafted", "cycles"))
        out["acceptance_rate"] = acc / dr if dr else 0.0
        out["acceptance_length"] = (acc + cyc) / cyc if cyc else 0.0
        out["serial_share"] = sum(s["serial_tokens"] for s in stats) / sum(r["n"] for r in runs)
        k_cycles: dict[str, int] = {}
        for s in stats:
            for k, c in s["k_cycles"].items():
                k_cycles[k] = k_cycles.get(k, 0) + c
        out["k_cycles"] = k_cycles
        # Counted, not timed: the verify cycles each generation drafted.
        out["cycles"] = [s["cycles"] for s in stats]
    return out


def _measure(
    arm: Arm,
    sc: dict[str, Any],
    modes: list[str],
    models: dict[str, str],
    prompts: list[str],
    tokens: int,
    temp: float = 0.0,
) -> dict[str, dict[str, Any]]:
    payload = {
        "target": models[sc["target"]],
        "draft": models[sc["draft"]] if sc["draft"] else None,
        "modes": modes,
        "draft_kind": sc["kind"],
        "k": K,
        "prompts": prompts,
        "max_tokens": tokens,
        "warmup_tokens": 16,
        "temp": temp,
    }
    result: dict[str, Any] = arm.run_json(PROBE, payload, timeout=3600)
    return {mode: _summary(v["runs"]) for mode, v in result["modes"].items()}


def _ratio(samples: list[dict[str, Any]], ref: list[dict[str, Any]], key: str) -> dict[str, float]:
    r = [a[key] / b[key] for a, b in zip(samples, ref, strict=True)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def _ci(candidate: list[float], reference: list[float]) -> dict[str, Any]:
    from overlay.check.stats import ratio_ci

    r = ratio_ci(candidate, reference)
    return {k: r[k] for k in ("ratio", "ci_low", "ci_high", "n")}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from overlay.check import models as tinymodels

    arms = arms_for(REPO, "mlx-lm")
    by_name = {"stock": arms.stock, "patched": arms.patched}
    names = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; choose from {sorted(SCENARIOS)}")
    kinds = sorted({SCENARIOS[n][k] for n in names for k in ("target", "draft") if SCENARIOS[n][k]})
    models = {}
    for kind in kinds:
        print(f"model: {kind}", file=sys.stderr, flush=True)
        models[kind] = str(tinymodels.build(kind, root=REPO, python=arms.stock.python))
    prompts = [tinymodels.PROMPTS[c][0] for c in CATEGORIES]
    report: dict[str, Any] = {
        "version": 1,
        "tokens": args.tokens,
        "reps": args.reps,
        "k_max": K,
        "temp": args.temp,
        "prompts": prompts,
        "arms": {a.name: a.version for a in (arms.stock, arms.patched)},
        "scenarios": {},
    }
    for name in names:
        sc = SCENARIOS[name]
        modes = _modes(sc, args.fixed)
        samples: dict[str, list[dict[str, Any]]] = {f"{a}/{m}": [] for a, ms in modes.items() for m in ms}
        load_before = _load()
        for rep in range(args.reps):
            order = ["stock", "patched"] if rep % 2 == 0 else ["patched", "stock"]
            for arm_name in order:
                print(
                    f"bench: {name} rep {rep + 1}/{args.reps} {arm_name} {'+'.join(modes[arm_name])}",
                    file=sys.stderr,
                    flush=True,
                )
                for mode, summary in _measure(
                    by_name[arm_name], sc, modes[arm_name], models, prompts, args.tokens, args.temp
                ).items():
                    samples[f"{arm_name}/{mode}"].append(summary)
        ref = samples["stock/serial"]
        own = samples["patched/serial"]
        entry: dict[str, Any] = {
            "pays": sc["pays"],
            "models": {k: sc[k] for k in ("target", "draft", "kind")},
            "load_average": {"before": load_before, "after": _load()},
            "configs": {},
        }
        for key, vals in samples.items():
            row: dict[str, Any] = {
                "tok_s": statistics.median(v["tok_s"] for v in vals),
                "cpu_tok_s": statistics.median(v["cpu_tok_s"] for v in vals),
                "ratio": _ratio(vals, ref, "tok_s"),
                "ratio_ci": _ci([v["tok_s"] for v in vals], [v["tok_s"] for v in ref]),
                "cpu_ratio": _ratio(vals, ref, "cpu_tok_s"),
                "identical": all(
                    v["tokens"] == r["tokens"] and v["text"] == r["text"]
                    for v, r in zip(vals, ref, strict=True)
                ),
            }
            if key.startswith("patched/"):
                # Same process, same moments (modes interleaved prompt by prompt): a tight comparison.
                row["ratio_vs_patched_serial"] = _ratio(vals, own, "tok_s")
                # Paired prompt by prompt (each pair ran back to back in one process).
                row["ratio_vs_patched_serial_ci"] = _ci(
                    [t for v in vals for t in v["per_prompt_tok_s"]],
                    [t for v in own for t in v["per_prompt_tok_s"]],
                )
                # In CPU time: what the work costs, less sensitive to other jobs taking the cores.
                row["cpu_ratio_vs_patched_serial_ci"] = _ci(
                    [t for v in vals for t in v["per_prompt_cpu_tok_s"]],
                    [t for v in own for t in v["per_prompt_cpu_tok_s"]],
                )
            for k in ("acceptance_rate", "acceptance_length", "serial_share"):
                if k in vals[-1]:
                    row[k] = statistics.median(v[k] for v in vals)
            if "k_cycles" in vals[-1]:
                row["k_cycles"] = vals[-1]["k_cycles"]
            if "cycles" in vals[-1]:
                per_generation = [c for v in vals for c in v["cycles"]]
                row["cycles_per_generation"] = {
                    "median": statistics.median(per_generation),
                    "min": min(per_generation),
                    "max": max(per_generation),
                    "all": per_generation,
                }
            entry["configs"][key] = row
        target = TARGET_PAYS if sc["pays"] else TARGET_CANNOT
        adaptive = entry["configs"]["patched/adaptive"]
        entry["target"] = target
        # Where drafting cannot pay, also against the patched wheel's own serial decoding: the other patches of
        # the series make every step faster, which must not hide what drafting costs.
        entry["target_own"] = None if sc["pays"] else TARGET_OWN
        entry["met"] = (
            adaptive["ratio"]["median"] >= target
            and (adaptive["identical"] or args.temp > 0)
            and (sc["pays"] or adaptive["ratio_vs_patched_serial_ci"]["ratio"] >= TARGET_OWN)
        )
        report["scenarios"][name] = entry
    return report


def _fmt_ci(r: dict[str, Any]) -> str:
    interval = f" [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if r["ci_low"] is not None else ""
    return f"{r['ratio']:.3f}x{interval}"


def _print(report: dict[str, Any]) -> None:
    print(
        f"mlx-lm speculative decoding: stock serial vs patched (k_max {report['k_max']}, "
        f"{report['tokens']} tokens x {len(report['prompts'])} prompts, {report['reps']} reps)"
    )
    print(
        f"  {'scenario / config':<30} {'tok/s':>8} {'vs stock serial':>21} {'cpu':>7} {'vs own [95% CI]':>24} "
        f"{'cpu vs own [95% CI]':>24} "
        f"{'accept':>7} {'len':>5} {'serial':>7} {'cycles/gen':>14} {'identical':>9}"
    )
    for name, entry in report["scenarios"].items():
        for key, row in entry["configs"].items():
            r, c = row["ratio"], row["cpu_ratio"]
            acc = f"{row['acceptance_rate']:.2f}" if "acceptance_rate" in row else "-"
            length = f"{row['acceptance_length']:.2f}" if "acceptance_length" in row else "-"
            serial = f"{row['serial_share']:.2f}" if "serial_share" in row else "-"
            cyc = "-"
            if "cycles_per_generation" in row:
                cg = row["cycles_per_generation"]
                cyc = f"{cg['median']:g} ({cg['min']}-{cg['max']})"
            own = cpu_own = "-"
            if "ratio_vs_patched_serial_ci" in row:
                own = _fmt_ci(row["ratio_vs_patched_serial_ci"])
                cpu_own = _fmt_ci(row["cpu_ratio_vs_patched_serial_ci"])
            print(
                f"  {name + ' ' + key:<30} {row['tok_s']:>8.1f} {r['median']:>6.2f}x ({r['min']:.2f}-{r['max']:.2f})"
                f" {c['median']:>6.2f}x {own:>24} {cpu_own:>24} {acc:>7} {length:>5} {serial:>7} {cyc:>14}"
                f" {row['identical']!s:>9}"
            )
        verdict = "met" if entry["met"] else "MISSED"
        against = (
            "stock serial"
            if entry["pays"]
            else f"stock serial and >= {entry['target_own']:.2f}x patched serial"
        )
        la = entry["load_average"]
        print(
            f"  -> {name}: target >= {entry['target']:.2f}x against {against}, identical greedy output: {verdict}"
            f" (load average {la['before'][0]} -> {la['after'][0]})"
        )


def acceptance(args: argparse.Namespace) -> dict[str, Any]:
    """Fixed-k acceptance at T = 0 and T = ``args.temp`` (0.7 unless given), against its expectation."""
    from overlay.check import models as tinymodels

    arms = arms_for(REPO, "mlx-lm")
    temp = args.temp or 0.7
    prompts = [tinymodels.PROMPTS[c][0] for c in CATEGORIES]
    report: dict[str, Any] = {
        "version": 1,
        "kind": "acceptance",
        "k": K,
        "tokens": args.tokens,
        "seeds": args.seeds,
        "temps": [0.0, temp],
        "prompts": prompts,
        "arm": arms.patched.version,
        "load_average": {"before": _load()},
        "pairs": {},
    }
    for name, (target, draft) in ACCEPTANCE_PAIRS.items():
        print(f"acceptance: {name} ({target}, {draft or 'its MTP head'})", file=sys.stderr, flush=True)
        payload = {
            "target": str(tinymodels.build(target, root=REPO, python=arms.stock.python)),
            "draft": str(tinymodels.build(draft, root=REPO, python=arms.stock.python)) if draft else None,
            "k": K,
            "max_tokens": args.tokens,
            "temps": [0.0, temp],
            "seeds": args.seeds,
            "prompts": prompts,
        }
        report["pairs"][name] = arms.patched.run_json(ACCEPTANCE, payload, timeout=3600)["temps"]
    report["load_average"]["after"] = _load()
    return report


def _print_acceptance(report: dict[str, Any]) -> None:
    lo, hi = report["temps"]
    print(
        f"speculative acceptance, fixed k = {report['k']}, {report['tokens']} tokens x {len(report['prompts'])} "
        f"prompts ({report['seeds']} seeds at T = {hi}); load average {report['load_average']['before'][0]} -> "
        f"{report['load_average']['after'][0]}"
    )
    for name, temps in report["pairs"].items():
        g, s = temps[str(lo)], temps[str(hi)]
        print(
            f"  {name}: accepted/drafted {g['acceptance_rate']:.3f} (T={lo}) -> {s['acceptance_rate']:.3f} (T={hi});"
            f" per reached position {g['per_reached']:.3f} -> {s['per_reached']:.3f}"
        )
        print(
            f"    T={hi}: expected sum(min(p, q)) {s['expected']:.3f} +- {1.96 * s['expected_se']:.3f} (95 %),"
            f" measured {s['per_reached']:.3f} (z = {s['z']:+.2f}, {s['reached']} reached positions);"
            f" argmax agreement on the same contexts {s['argmax_agree']:.3f}"
        )
        for i, (pg, ps) in enumerate(zip(g["position"], s["position"], strict=True)):
            print(
                f"    position {i}: T={lo} {pg['per_reached']:.3f} ({pg['reached']}), T={hi} {ps['per_reached']:.3f}"
                f" ({ps['reached']}), expected {ps['expected']:.3f}, argmax agreement {ps['argmax_agree']:.3f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per config (default 5)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per prompt (default 256)")
    parser.add_argument("--scenarios", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    parser.add_argument(
        "--fixed", action="store_true", help="also run fixed-k speculation (stock and patched)"
    )
    parser.add_argument("--temp", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    parser.add_argument(
        "--acceptance",
        action="store_true",
        help="measure acceptance against its expectation sum(min(p, q)) at T = 0 and --temp (default 0.7)",
    )
    parser.add_argument(
        "--seeds", type=int, default=6, help="--acceptance: seeds per prompt at T > 0 (default 6)"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=REPO / "build" / "reports" / "mlx-spec-bench.json",
        help="report path (default build/reports/mlx-spec-bench.json)",
    )
    args = parser.parse_args(argv)
    if args.reps < 1 or args.tokens < 2:
        parser.error("--reps must be >= 1 and --tokens >= 2")
    import json

    if args.acceptance:
        report = acceptance(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.json, json.dumps(report, indent=1) + "\n")
        _print_acceptance(report)
        print(f"report: {args.json}")
        return 0
    report = run(args)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.json, json.dumps(report, indent=1) + "\n")
    _print(report)
    print(f"report: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
