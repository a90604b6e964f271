#!/usr/bin/env python3
"""Benchmark: stock vs patched mlx-lm (fused dispatch, sampling, indexer, prefill dequant), side by side, in one run.

    .venv/bin/python scripts/bench_mlx_fused.py [--reps N] [--tokens N] [--per-patch] [--parts decode,sampler,...]

Runs the probe tests/engines/mlx_lm/probes/fused_bench.py in the stock and the patched arm (the same venvs the tests
use), interleaved ABBA over N repetitions, each repetition a fresh process per arm. Both arms run every variant in the
same order (stock ignores the settings it does not have), so each patched number is paired with a stock number taken
at the same position in a process; a variant that changes nothing for a family is an A/A control. Every number is a
median within a repetition; the table shows the median over repetitions per arm and the median (min-max) of the
per-repetition ratios stock/patched (> 1: patched is faster). Decode primitives are the deterministic op counts of one
greedy step. Tiny fp32 models on the CPU backend: the ratios say how much per-token overhead a patch removes here,
not what a Mac GPU gains. Writes a JSON report (default build/reports/mlx-fused-bench.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from overlay.check.envs import arms_for
from overlay.check.stats import fmt_ratio, ratio_ci
from overlay.fsutil import atomic_write_text

PROBE = REPO / "tests" / "engines" / "mlx_lm" / "probes" / "fused_bench.py"
FAMILIES = ["llama", "qwen3", "qwen3_5", "deepseek_v3", "llama_mid"]
PARTS = ("decode", "sampler", "indexer", "prefill")
VARIANTS: dict[str, dict[str, Any]] = {
    "fused": {},  # the patched defaults: every exact fusion on
    "fused+proj": {"env": {"MLX_LM_FUSED_PROJ": "1"}},
}
# --per-patch: one exact fusion on, the others off (module switches, read at call time).
_SWITCHES = {
    "norm": "mlx_lm.models.fused_ops:FUSED_NORM",
    "rope": "mlx_lm.models.fused_ops:FUSED_ROPE",
    "gdn": "mlx_lm.models.gated_delta:_FUSED_GDN_STEP",
    "head": "mlx_lm.sample_head:COMPILED_HEAD",
}
PER_PATCH_VARIANTS = {
    f"only-{name}": {"globals": {key: (other == name) for other, key in _SWITCHES.items()}}
    for name in _SWITCHES
}


def _payload(
    root: str, args: argparse.Namespace, variants: dict[str, Any], parts: list[str]
) -> dict[str, Any]:
    return {
        "root": root,
        "parts": parts,
        "tokens": args.tokens,
        "families": args.families.split(",") if args.families else FAMILIES,
        "variants": variants,
        "vocab": [512, 32768, 151936],
        "indexer": [[131072, 2048], [131072, 512], [32768, 2048]],
        "prefill_tokens": 256,
        "prefill_reps": 2,
        "prefill_variants": {"qmm": {}, "dequant": {"env": {"MLX_LM_PREFILL_DEQUANT": "1"}}},
        "sampler_reps": 30,
    }


def _median_ratio(stock: list[float], patched: list[float]) -> tuple[float, float, float]:
    ratios = [s / p for s, p in zip(stock, patched, strict=True) if p > 0]
    return statistics.median(ratios), min(ratios), max(ratios)


def _row(label: str, stock: list[float], patched: list[float], scale: float, unit: str) -> str:
    med, lo, hi = _median_ratio(stock, patched)
    s, p = statistics.median(stock) * scale, statistics.median(patched) * scale
    return f"  {label:<34} {s:>10.3f} {p:>10.3f} {unit:<6} {med:>6.2f}x ({lo:.2f}-{hi:.2f})"


def _decode(
    st: list[dict[str, Any]], pa: list[dict[str, Any]], lines: list[str], report: dict[str, Any]
) -> None:
    lines.append("decode, one greedy step (generate_step); wall ms/token, then process CPU ms/token")
    for variant, by_family in pa[0]["decode"].items():
        for fam in by_family:
            s = [r["decode"][variant][fam]["s_per_tok"] for r in st]
            p = [r["decode"][variant][fam]["s_per_tok"] for r in pa]
            sc = [r["decode"][variant][fam]["cpu_per_tok"] for r in st]
            pc = [r["decode"][variant][fam]["cpu_per_tok"] for r in pa]
            ps, pp = st[0]["decode"][variant][fam]["primitives"], by_family[fam]["primitives"]
            lines.append(_row(f"{fam} [{variant}]", s, p, 1e3, "ms"))
            lines.append(_row("  CPU (all threads)", sc, pc, 1e3, "ms"))
            lines.append(f"  {'  primitives per step':<34} {ps:>10d} {pp:>10d} {'':<6} {pp - ps:+d}")
            report["decode"][f"{fam}/{variant}"] = {
                "stock_s": s,
                "patched_s": p,
                "ratio": _median_ratio(s, p),
                "stock_cpu_s": sc,
                "patched_cpu_s": pc,
                "cpu_ratio": _median_ratio(sc, pc),
                "primitives": {"stock": ps, "patched": pp},
            }


def _sampler(
    st: list[dict[str, Any]], pa: list[dict[str, Any]], lines: list[str], report: dict[str, Any]
) -> None:
    lines.append(
        "sampler, one call (V = vocabulary; +preselect / +candidates: opt-in switches, stock runs the chain)"
    )
    for key in st[0]["sampler"]:
        s = [r["sampler"][key] for r in st]
        p = [r["sampler"][key] for r in pa]
        lines.append(_row(key, s, p, 1e3, "ms"))
        report["sampler"][key] = {"stock_s": s, "patched_s": p, "ratio": _median_ratio(s, p)}
    # Patch 0006 alone: the patched arm's chain with its compiled call turned off (MLX_LM_FUSED_SAMPLER=0, set as
    # the module global in-process) against the default, per repetition in the same process.
    lines.append(
        "0006 alone, patched arm: unfused chain (MLX_LM_FUSED_SAMPLER=0) / default, paired per repetition"
    )
    for key in [k for k in pa[0]["sampler"] if "-unfused@" in k]:
        fused_key = key.replace("-unfused@", "@")
        off = [r["sampler"][key] for r in pa]
        on = [r["sampler"][fused_key] for r in pa]
        ci = ratio_ci(off, on)  # off / on: above 1 when the compiled chain is faster
        lines.append(
            f"  {fused_key:<34} {statistics.median(off) * 1e3:>10.3f} {statistics.median(on) * 1e3:>10.3f} "
            f"{'ms':<6} {fmt_ratio(ci, 3, 'x')}"
        )
        report["sampler"][f"0006:{fused_key}"] = {"off_s": off, "on_s": on, "ratio_ci": ci}


def _indexer(
    st: list[dict[str, Any]], pa: list[dict[str, Any]], lines: list[str], report: dict[str, Any]
) -> None:
    lines.append(
        "indexer top-k of one decode row (patched: block-max preselection, full path where it declines)"
    )
    for key in st[0]["indexer"]:
        tail = key.split("@", 1)[1]
        s = [r["indexer"][key] for r in st]
        p = [r["indexer"].get(f"preselect@{tail}", r["indexer"][key]) for r in pa]
        lines.append(_row(f"top-k {tail}", s, p, 1e3, "ms"))
        report["indexer"][tail] = {"stock_s": s, "patched_s": p, "ratio": _median_ratio(s, p)}


def _prefill(
    st: list[dict[str, Any]], pa: list[dict[str, Any]], lines: list[str], report: dict[str, Any]
) -> None:
    lines.append("prefill of a 4-bit llama_mid, one 256-token chunk (dequant: MLX_LM_PREFILL_DEQUANT=1)")
    for variant in st[0]["prefill"]:
        s = [r["prefill"][variant] for r in st]
        p = [r["prefill"][variant] for r in pa]
        lines.append(_row(f"prefill [{variant}]", s, p, 1.0, "s"))
        report["prefill"][variant] = {"stock_s": s, "patched_s": p, "ratio": _median_ratio(s, p)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4, help="interleaved repetitions per arm (default 4)")
    ap.add_argument("--tokens", type=int, default=48, help="decode tokens per measurement (default 48)")
    ap.add_argument("--per-patch", action="store_true", help="also time each exact fusion alone")
    ap.add_argument("--families", help=f"comma-separated tiny model families (default {','.join(FAMILIES)})")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"what to measure (default {','.join(PARTS)})")
    ap.add_argument("--json", type=Path, default=REPO / "build" / "reports" / "mlx-fused-bench.json")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"--parts: unknown {sorted(unknown)}; choose from {','.join(PARTS)}")
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")

    variants = {**VARIANTS, **(PER_PATCH_VARIANTS if args.per_patch else {})}
    arms = arms_for(REPO, "mlx-lm")
    runs: dict[str, list[dict[str, Any]]] = {"stock": [], "patched": []}
    with tempfile.TemporaryDirectory(prefix="mlx-fused-bench-") as root:
        # Build the tiny models once (stock arm), so the timed runs only load them.
        warm = {
            **_payload(root, args, {"fused": {}}, [p for p in parts if p in ("decode", "prefill")]),
            "tokens": 4,
        }
        arms.stock.run_json(PROBE, warm)
        for rep in range(args.reps):
            order = ("stock", "patched") if rep % 2 == 0 else ("patched", "stock")
            for name in order:
                print(f"rep {rep + 1}/{args.reps}: {name}", file=sys.stderr, flush=True)
                runs[name].append(getattr(arms, name).run_json(PROBE, _payload(root, args, variants, parts)))

    st, pa = runs["stock"], runs["patched"]
    lines = [
        (
            f"mlx-lm stock {arms.stock.version} vs patched {arms.patched.version}; {args.reps} interleaved reps, "
            "ratio = stock/patched time (> 1: patched faster)"
        ),
        f"  {'measurement':<34} {'stock':>10} {'patched':>10} {'unit':<6} ratio (min-max)",
    ]
    report: dict[str, Any] = {
        "version": 1,
        "stock": arms.stock.version,
        "patched": arms.patched.version,
        "reps": args.reps,
        "decode": {},
        "sampler": {},
        "indexer": {},
        "prefill": {},
    }
    for part, fn in (
        ("decode", _decode),
        ("sampler", _sampler),
        ("indexer", _indexer),
        ("prefill", _prefill),
    ):
        if part in parts:
            fn(st, pa, lines, report)
    print("\n".join(lines))
    atomic_write_text(args.json, json.dumps(report, indent=1) + "\n")
    print(f"report: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
