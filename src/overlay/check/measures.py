"""What a check measures in the arms' results: greedy identity, teacher-forced agreement, speculative acceptance, and
interleaved speed repetitions with their paired ratios (each labelled with which direction is better)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from overlay.check import stats
from overlay.check.adapter import EngineAdapter, Models
from overlay.check.envs import Arm
from overlay.progress import Reporter

# which way is better for each speed metric (ratio = patched / stock)
SPEED_METRICS = {
    "decode": ("decode_tok_s", "tok/s", True),
    "decode_cpu": ("decode_cpu_tok_s", "tok/s of CPU time", True),
    "prefill": ("prefill_tok_s", "tok/s", True),
    "cold_start": ("cold_start_s", "s", False),
}


def compare_greedy(
    ref: dict[str, Any], cand: dict[str, Any], prompts: list[dict[str, Any]]
) -> dict[str, Any]:
    identical = 0
    first: dict[str, Any] | None = None
    max_diff = 0.0
    bit_identical = True
    for i, (a, b) in enumerate(zip(ref["outputs"], cand["outputs"])):
        if a == b:
            identical += 1
        elif first is None:
            t = (
                next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
                if any(x != y for x, y in zip(a, b))
                else min(len(a), len(b))
            )
            first = {
                "prompt": i,
                "category": prompts[i]["category"],
                "position": t,
                "stock_token": a[t] if t < len(a) else None,
                "patched_token": b[t] if t < len(b) else None,
                "logit_margin": ref["margins"][i][t] if t < len(ref["margins"][i]) else None,
                "patched_margin": cand["margins"][i][t] if t < len(cand["margins"][i]) else None,
            }
        if ref.get("files") and cand.get("files"):
            la, lb = np.load(ref["files"][i]), np.load(cand["files"][i])
            n = min(len(la), len(lb), next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) + 1)
            if la[:n].shape == lb[:n].shape:
                bit_identical &= bool(np.array_equal(la[:n], lb[:n]))
                if n:
                    max_diff = max(max_diff, float(np.max(np.abs(la[:n] - lb[:n]))))
    return {
        "prompts": len(ref["outputs"]),
        "identical_count": identical,
        "identical": identical == len(ref["outputs"]),
        "first_divergence": first,
        "logprobs_bit_identical": bit_identical,
        "logprobs_max_abs_diff": max_diff,
    }


def logit_agreement(ref_files: list[str], cand_files: list[str], seqs: list[list[int]]) -> dict[str, Any]:
    out = []
    for rf, cf, seq in zip(ref_files, cand_files, seqs):
        out.append(stats.agreement(np.load(rf), np.load(cf), np.asarray(seq[1:])))
    return stats.summarize(out)


def _acceptance(accepted: int, drafted: int, cycles: int) -> dict[str, Any]:
    return {
        "accepted": accepted,
        "drafted": drafted,
        "cycles": cycles,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_length": (accepted + cycles) / cycles if cycles else 0.0,
    }


def spec_summary(run: dict[str, Any], k: int, *, engine_counters: bool = True) -> dict[str, Any]:
    """Acceptance from one spec run: the engine's exact counters when it reports them for every prompt (patched
    mlx-lm does) and ``engine_counters`` is set, else derived from the per-token ``from_draft`` flags (every verify
    cycle emits its accepted drafts then one target token; an estimate: the last cycle may draft fewer). Engine
    counters, when present, are also kept under ``engine``."""
    flag_a = flag_c = 0
    eng = [0, 0, 0]
    exact = True
    for r in run["results"]:
        flags = r["from_draft"]
        flag_a += sum(flags)
        flag_c += len(flags) - sum(flags)
        s = r.get("stats")
        if s and {"accepted", "drafted", "cycles"} <= set(s):
            eng = [eng[0] + int(s["accepted"]), eng[1] + int(s["drafted"]), eng[2] + int(s["cycles"])]
        else:
            exact = False
    engine = _acceptance(*eng) if exact and run["results"] else None
    if engine is not None and engine_counters:
        return {**engine, "counters": "engine", "engine": engine}
    out = {
        **_acceptance(flag_a, flag_c * k, flag_c),
        "counters": "derived from from_draft flags (an estimate: the last cycle may draft fewer)",
    }
    if engine is not None:
        out["engine"] = engine
    return out


def speed_runs(
    adapter: EngineAdapter,
    arms: Sequence[Arm],
    models: Models,
    prompt: list[int],
    *,
    reps: int,
    decode_tokens: int,
    reporter: Reporter,
    cold: bool,
) -> dict[str, dict[str, list[float]]]:
    samples: dict[str, dict[str, list[float]]] = {
        a.name: {"decode_tok_s": [], "decode_cpu_tok_s": [], "prefill_tok_s": [], "cold_start_s": []}
        for a in arms
    }
    for rep in range(reps):
        order = list(arms[rep % len(arms) :]) + list(arms[: rep % len(arms)])
        for arm in order:
            res = adapter.run(
                arm,
                {
                    "task": "speed",
                    "model": str(models.target),
                    "prompt": prompt,
                    "decode_tokens": decode_tokens,
                },
            )
            samples[arm.name]["decode_tok_s"].append(res["decode_tok_s"])
            samples[arm.name]["prefill_tok_s"].append(res["prefill_tok_s"])
            if "decode_cpu_tok_s" in res:
                samples[arm.name]["decode_cpu_tok_s"].append(res["decode_cpu_tok_s"])
            if cold:
                t0 = time.time()
                c = adapter.run(arm, {"task": "cold", "model": str(models.target), "prompt": prompt[:16]})
                samples[arm.name]["cold_start_s"].append(c["t_first_token"] - t0)
        reporter.step("check", f"speed: repetition {rep + 1}/{reps} done")
    return samples


def speed_block(samples: dict[str, dict[str, list[float]]], cand: str, ref: str) -> dict[str, Any]:
    """Per-arm spreads and, per metric, the paired ratio cand/ref with its interval, which direction is better and
    the verdict: "better", "worse" or "inconclusive" (the interval spans 1.0)."""
    out: dict[str, Any] = {}
    for name in (ref, cand):
        out[name] = {k: stats.spread(v) for k, v in samples[name].items() if v}
    out["ratio"] = {}
    for metric, (key, unit, higher) in SPEED_METRICS.items():
        if samples[cand].get(key) and samples[ref].get(key):
            r: dict[str, Any] = dict(stats.ratio_ci(samples[cand][key], samples[ref][key]))
            r.update(
                better="higher" if higher else "lower",
                unit=unit,
                verdict=stats.speed_verdict(r, higher_is_better=higher),
            )
            out["ratio"][metric] = r
    return out
