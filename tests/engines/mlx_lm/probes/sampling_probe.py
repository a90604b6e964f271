"""Probe: mlx-lm samplers on fixed log-probabilities, stock or patched.

Payload: {"streams": [stream case, ...], "dists": [distribution case, ...]}.
- Stream case {"id", "vocab", "scale", "config": make_sampler kwargs, "env": {...}, "draws", "seed"}: ``draws``
  sequential one-row calls after ``mx.random.seed(seed)``; returns the token list (and, for the first case of each
  vocabulary size, the primitives of one call).
- Distribution case {"id", "vocab", "scale", "config", "env", "rows", "calls", "seed"}: ``calls`` batched calls of
  ``rows`` identical rows; returns the histogram of the draws and the exact distribution of the stock filter chain
  (``apply_top_p`` -> ``apply_min_p`` -> ``apply_top_k`` -> softmax of logprobs / temp), from this arm's public
  functions.
``env`` is set in-process around ``make_sampler`` (the patched samplers read it there).
Log-probabilities: seeded normal logits times ``scale``, normalized.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from fused_common import count_primitives
from probe_io import emit, env_override, log, read_payload


def _logprobs(vocab: int, scale: float, seed: int = 0) -> mx.array:
    rng = np.random.default_rng(seed)
    logits = mx.array((rng.standard_normal((1, vocab)) * scale).astype(np.float32))
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.eval(lp)
    return lp


def _make(config: dict[str, Any], env: dict[str, str]) -> Any:
    from mlx_lm.sample_utils import make_sampler

    with env_override(env):
        return make_sampler(**config)


def _exact(lp: mx.array, config: dict[str, Any]) -> np.ndarray:
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    x = lp
    top_p, min_p, top_k = config.get("top_p", 0.0), config.get("min_p", 0.0), config.get("top_k", 0)
    if 0 < top_p < 1.0:
        x = apply_top_p(x, top_p)
    if min_p != 0.0:
        x = apply_min_p(x, min_p, config.get("min_tokens_to_keep", 1))
    if top_k > 0:
        x = apply_top_k(x, top_k)
    p = mx.softmax(x.astype(mx.float32) * (1.0 / config["temp"]), axis=-1)
    probs: np.ndarray[Any, Any] = np.array(p)[0].astype(np.float64)
    return probs


def stream(case: dict[str, Any], count: bool) -> dict[str, Any]:
    lp = _logprobs(case["vocab"], case["scale"])
    sampler = _make(case["config"], case.get("env", {}))
    mx.random.seed(case["seed"])
    tokens = [int(sampler(lp).item()) for _ in range(case["draws"])]
    res: dict[str, Any] = {"tokens": tokens}
    if count:
        res["primitives"] = count_primitives(sampler(lp))["total"]
    return res


def dist(case: dict[str, Any]) -> dict[str, Any]:
    lp = _logprobs(case["vocab"], case["scale"])
    sampler = _make(case["config"], case.get("env", {}))
    batch = mx.broadcast_to(lp, (case["rows"], case["vocab"]))
    mx.random.seed(case["seed"])
    hist = np.zeros(case["vocab"], dtype=np.int64)
    for _ in range(case["calls"]):
        toks = np.array(sampler(batch)).reshape(-1)
        hist += np.bincount(toks, minlength=case["vocab"])
    exact = _exact(lp, case["config"])
    allowed = np.nonzero(exact > 0)[0]
    return {
        "hist": {int(i): int(c) for i, c in enumerate(hist) if c},
        "exact": {int(i): float(exact[i]) for i in allowed},
    }


def main() -> None:
    p = read_payload()
    out: dict[str, Any] = {"version": 1, "streams": {}, "dists": {}}
    seen: set[int] = set()
    for case in p.get("streams", []):
        log(f"stream {case['id']}")
        out["streams"][case["id"]] = stream(case, count=case["vocab"] not in seen)
        seen.add(case["vocab"])
    for case in p.get("dists", []):
        log(f"dist {case['id']}")
        out["dists"][case["id"]] = dist(case)
    emit(out)


if __name__ == "__main__":
    main()
