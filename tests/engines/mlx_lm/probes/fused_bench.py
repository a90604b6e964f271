"""Benchmark probe for scripts/bench_mlx_fused.py: one arm, one repetition, medians per measurement.

Payload: {"root": models folder, "parts": [decode|sampler|indexer|prefill, ...], "tokens": decode tokens per run,
"families": [...], "variants": {name: {"env": {...}, "globals": {...}}}, "vocab": [...], "indexer": [[T, k], ...],
"prefill_tokens", "prefill_reps", "prefill_variants": {name: settings}, "sampler_reps"}.
Prints {"version": 1, "decode": {variant: {family: {"s_per_tok", "cpu_per_tok", "primitives"}}}, "sampler": {...},
"indexer": {...}, "prefill": {...}}. Settings the arm does not know are ignored (stock runs them as its default).
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import numpy as np
from fused_common import ensure_model, greedy_step_primitives, load, prompt_tokens
from probe_io import emit, log, read_payload, settings


def _decode(model: Any, tokens: int) -> tuple[float, float]:
    """Median wall seconds per token, and process CPU seconds per token (all threads), of greedy decoding."""
    from mlx_lm.generate import generate_step

    stamps, cpu = [], []
    for _ in generate_step(prompt_tokens(0, 24), model, max_tokens=tokens):
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())
    gaps = np.diff(stamps[2:])  # skip prefill and the first compile-warm steps
    return float(np.median(gaps)), (cpu[-1] - cpu[2]) / (len(cpu) - 3)


def _sampler(vocab: list[int], reps: int) -> dict[str, Any]:
    from mlx_lm.sample_utils import make_sampler

    chain = {"temp": 0.7, "top_p": 0.9, "min_p": 0.05, "top_k": 40}
    unfused = {
        "globals": {"mlx_lm.sample_utils:FUSED_SAMPLER": False}
    }  # patch 0006 off (stock: no such global)
    configs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "chain": (chain, {}),
        "chain-unfused": (chain, unfused),
        "chain+preselect": (chain, {"env": {"MLX_LM_TOPK_PRESELECT": "1"}}),
        "top_p": ({"temp": 0.7, "top_p": 0.9}, {}),
        "top_p-unfused": ({"temp": 0.7, "top_p": 0.9}, unfused),
        "top_p+candidates": ({"temp": 0.7, "top_p": 0.9}, {"env": {"MLX_LM_TOPP_CANDIDATES": "1024"}}),
    }
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for V in vocab:
        # A peaked distribution, like a trained model's: the top 1024 hold well over 90 % of the mass.
        logits = mx.array((rng.standard_normal((1, V)) * 4.0).astype(np.float32))
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        mx.eval(lp)
        for name, (kw, spec) in configs.items():
            with settings(spec):
                sampler = make_sampler(**kw)
                for _ in range(3):
                    mx.eval(sampler(lp))
                times = []
                for _ in range(reps):
                    t = time.perf_counter()
                    mx.eval(sampler(lp))
                    times.append(time.perf_counter() - t)
            out[f"{name}@{V}"] = float(np.median(times))
    return out


def _indexer(cases: list[list[int]], reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        from mlx_lm.models.deepseek_v32 import _preselected_topk
    except ImportError:
        _preselected_topk = None
    rng = np.random.default_rng(0)
    for T, k in cases:
        scores = mx.array(rng.standard_normal((1, 1, 1, T)).astype(np.float32))
        mx.eval(scores)

        def full(scores: mx.array = scores, k: int = k) -> mx.array:
            return mx.argpartition(scores, kth=-k, axis=-1)[..., -k:]

        fns = {"argpartition": full}
        if _preselected_topk is not None:

            def pre(scores: mx.array = scores, k: int = k, full: Any = full) -> mx.array:
                # As the indexer runs it: the preselection, or the full path where it declines.
                r = _preselected_topk(scores, k)
                return full() if r is None else r

            fns["preselect"] = pre
        for name, fn in fns.items():
            mx.eval(fn())
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                mx.eval(fn())
                times.append(time.perf_counter() - t)
            out[f"{name}@T={T},k={k}"] = float(np.median(times))
    return out


def _prefill(root: str, n: int, reps: int, variants: dict[str, Any]) -> dict[str, Any]:
    from mlx_lm.models.cache import make_prompt_cache

    out: dict[str, Any] = {}
    path = ensure_model(root, "llama_mid", quantize={"group_size": 64, "bits": 4})
    for name, spec in variants.items():
        with settings(spec):
            model = load(path)
        mx.eval(model(prompt_tokens(0, 16)[None]))  # warm
        times = []
        for _ in range(reps):
            cache = make_prompt_cache(model)
            t = time.perf_counter()
            mx.eval(model(prompt_tokens(0, n)[None], cache=cache))
            times.append(time.perf_counter() - t)
        out[name] = float(np.median(times))
    return out


def main() -> None:
    p = read_payload()
    parts = set(p.get("parts", ["decode", "sampler", "indexer", "prefill"]))
    res: dict[str, Any] = {"version": 1, "decode": {}, "sampler": {}, "indexer": {}, "prefill": {}}
    if "decode" in parts:
        for vname, spec in p["variants"].items():
            res["decode"][vname] = {}
            for fam in p["families"]:
                with settings(spec):
                    model = load(ensure_model(p["root"], fam))
                    prims = greedy_step_primitives(model, prompt_tokens(0, 24))["total"]
                    s_per_tok, cpu_per_tok = _decode(model, p["tokens"])
                res["decode"][vname][fam] = {
                    "s_per_tok": s_per_tok,
                    "cpu_per_tok": cpu_per_tok,
                    "primitives": prims,
                }
                log(f"{vname} {fam}: {1 / s_per_tok:.1f} tok/s, {prims} primitives")
    if "sampler" in parts:
        res["sampler"] = _sampler(p["vocab"], p.get("sampler_reps", 20))
    if "indexer" in parts:
        res["indexer"] = _indexer(p["indexer"], p.get("indexer_reps", 10))
    if "prefill" in parts:
        res["prefill"] = _prefill(
            p["root"], p["prefill_tokens"], p.get("prefill_reps", 3), p["prefill_variants"]
        )
    emit(res)


if __name__ == "__main__":
    main()
