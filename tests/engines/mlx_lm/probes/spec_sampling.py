"""Probe: the distribution of sampled (temp > 0) speculative decoding, against the exact serial distribution.

Payload: {"target": folder, "draft": folder | null (null: ``draft_kind="mtp"``, target loaded with keep_mtp),
"prompt": [ids], "k": drafts per cycle, "runs": seeds per config, "configs": [config, ...], "reference": bool,
"mode": "spec" | "exact" | "wrong" | "serial" | "unit", "unit_rows": rows of the unit mode, "build": {build()
arguments} | null (write a model first: the drafter of this test, made by the stock arm)}. A config: {"name", "temp", "top_p", "top_k", "min_p",
"repetition_penalty"} (make_sampler / make_logits_processors arguments).

- ``reference`` (run it in the stock arm): the exact distributions of serial sampling at output positions 0 and 1,
  written from stock's sampler definition (log-softmax, then the filters top-p -> min-p -> top-k of stock
  ``make_sampler``, then the temperature; logits processors before all), with the stock filter functions; position
  1 is the marginal over every first token (one batched forward over all of them). Also the drafter's distribution at
  position 0, and the expected acceptance of the first draft ``sum(min(p, q))`` (and ``sum(p * q)``, the expected
  acceptance of an exact-match verify, which draws the target's token independently).
- ``mode`` (``runs`` seeds, 2 tokens each): ``serial`` stock ``generate_step``; ``spec`` ``speculative_generate_step``
  with the sampler as given; ``exact`` the same with the sampler wrapped in a plain function (no known distribution:
  the exact-match acceptance of today); ``wrong`` rejection sampling with a deliberately wrong residual (a rejected
  position is resampled from ``p`` instead of ``max(0, p - q)``), to show the test has power; ``unit``
  ``speculative_accept`` itself (and the wrong variant) on ``unit_rows`` independent copies of position 0 at once
  (drafts drawn from ``q``; vectorised, so the test can afford many samples): the emitted token counts and the
  number of accepted drafts.

Result: {"reference": {...} | null, "counts": {config: [[count per token] position 0, position 1]},
"first_accept": {config: accepted first drafts}, "first_drafted": {config: cycles with a first draft}, "seconds"}.
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import numpy as np
from probe_io import emit, read_payload


def _sampler(cfg: dict[str, Any]) -> Any:
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(
        cfg["temp"], top_p=cfg.get("top_p", 0.0), min_p=cfg.get("min_p", 0.0), top_k=cfg.get("top_k", 0)
    )


def _processors(cfg: dict[str, Any]) -> list[Any]:
    from mlx_lm.sample_utils import make_logits_processors

    penalty = cfg.get("repetition_penalty")
    return make_logits_processors(repetition_penalty=penalty) if penalty else []


def _probs(cfg: dict[str, Any], context: list[int], logits: mx.array) -> np.ndarray:
    """Serial sampling's distribution for one row of logits (1 x V), from stock's definition."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    for proc in _processors(cfg):
        logits = proc(mx.array(context, mx.uint32), logits)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if 0 < cfg.get("top_p", 0.0) < 1.0:
        lp = apply_top_p(lp, cfg["top_p"])
    if cfg.get("min_p", 0.0):
        lp = apply_min_p(lp, cfg["min_p"])
    if cfg.get("top_k", 0) > 0:
        lp = apply_top_k(lp, cfg["top_k"])
    p = mx.softmax(lp.astype(mx.float32) * (1.0 / cfg["temp"]), axis=-1)
    return np.array(p[0], dtype=np.float64)


def _last_logits(model: Any, rows: list[list[int]]) -> mx.array:
    out = model(mx.array(rows, mx.uint32))
    return out[:, -1, :].astype(mx.float32)


def _reference(payload: dict[str, Any], target: Any, draft: Any) -> dict[str, Any]:
    prompt = payload["prompt"]
    out: dict[str, Any] = {}
    base = _last_logits(target, [prompt])
    for cfg in payload["configs"]:
        p0 = _probs(cfg, prompt, base)
        firsts = [int(x) for x in np.nonzero(p0 > 1e-12)[0]]
        logits = _last_logits(target, [prompt + [x] for x in firsts])
        p1 = np.zeros_like(p0)
        for row, x in enumerate(firsts):
            p1 += p0[x] * _probs(cfg, prompt + [x], logits[row : row + 1])
        ref: dict[str, Any] = {"p0": p0.tolist(), "p1": p1.tolist()}
        if draft is not None:
            q0 = _probs(cfg, prompt, _last_logits(draft, [prompt]))
            ref.update(
                q0=q0.tolist(),
                accept_min=float(np.minimum(p0, q0).sum()),
                accept_exact=float((p0 * q0).sum()),
            )
        out[cfg["name"]] = ref
    return out


def _wrong_accept(target_logits: mx.array, draft_logits: mx.array, draft_tokens: mx.array) -> Any:
    """Rejection sampling whose rejected positions resample from p, not from the residual max(0, p - q)."""
    p = mx.softmax(target_logits.astype(mx.float32), axis=-1)
    q = mx.softmax(draft_logits.astype(mx.float32), axis=-1)
    idx = draft_tokens.astype(mx.uint32)[:, None]
    p_x = mx.take_along_axis(p, idx, axis=-1).squeeze(-1)
    q_x = mx.take_along_axis(q, idx, axis=-1).squeeze(-1)
    accept = mx.random.uniform(shape=p_x.shape) * q_x < p_x
    return accept, mx.random.categorical(mx.log(p))


def _sample(payload: dict[str, Any], target: Any, draft: Any) -> dict[str, Any]:
    import importlib

    gen: Any = importlib.import_module("mlx_lm.generate")

    mode = payload["mode"]
    prompt = mx.array(payload["prompt"], mx.uint32)
    vocab = target.args.vocab_size if hasattr(target, "args") else None
    counts: dict[str, Any] = {}
    first_accept: dict[str, int] = {}
    first_drafted: dict[str, int] = {}
    if mode == "wrong":
        gen.speculative_accept = _wrong_accept
    for cfg in payload["configs"]:
        sampler = _sampler(cfg)
        if mode == "exact":
            plain = sampler

            def sampler(lp: mx.array, plain: Any = plain) -> mx.array:
                return plain(lp)

        hist: list[dict[int, int]] = [{}, {}]
        accepted = drafted = 0
        for seed in range(payload["runs"]):
            mx.random.seed(seed)
            procs = _processors(cfg)
            if mode == "serial":
                steps = gen.generate_step(
                    prompt, target, max_tokens=2, sampler=sampler, logits_processors=procs
                )
                toks = [(int(t), False) for t, _ in steps]
            else:
                kwargs: dict[str, Any] = {"draft_kind": "mtp"} if draft is None else {}
                steps = gen.speculative_generate_step(
                    prompt,
                    target,
                    draft,
                    num_draft_tokens=payload["k"],
                    max_tokens=2,
                    sampler=sampler,
                    logits_processors=procs,
                    **kwargs,
                )
                toks = [(int(t), bool(d)) for t, _, d in steps]
            for pos, (tok, _) in enumerate(toks[:2]):
                hist[pos][tok] = hist[pos].get(tok, 0) + 1
            # The first drafted position: token 0 of a model drafter's first cycle, token 1 for MTP (its first
            # token is a plain step).
            at = 0 if draft is not None else 1
            if mode != "serial" and len(toks) > at:
                drafted += 1
                accepted += int(toks[at][1])
        size = vocab or (max(max(h) for h in hist if h) + 1)
        counts[cfg["name"]] = [[h.get(i, 0) for i in range(size)] for h in hist]
        first_accept[cfg["name"]] = accepted
        first_drafted[cfg["name"]] = drafted
    return {"counts": counts, "first_accept": first_accept, "first_drafted": first_drafted}


def _unit(payload: dict[str, Any], target: Any, draft: Any) -> dict[str, Any]:
    import importlib

    gen: Any = importlib.import_module("mlx_lm.generate")
    prompt, rows = payload["prompt"], payload["unit_rows"]
    out: dict[str, Any] = {}
    for cfg in payload["configs"]:
        p = _probs(cfg, prompt, _last_logits(target, [prompt]))
        q = _probs(cfg, prompt, _last_logits(draft, [prompt]))
        logp = mx.broadcast_to(mx.log(mx.array(p, mx.float32)), (rows, p.size))
        logq = mx.broadcast_to(mx.log(mx.array(q, mx.float32)), (rows, q.size))
        res: dict[str, Any] = {}
        for name, fn in (("right", gen.speculative_accept), ("wrong", _wrong_accept)):
            mx.random.seed(1)
            drafts = mx.random.categorical(logq)
            accept, residual = fn(logp, logq, drafts)
            emitted = mx.where(accept, drafts, residual)
            res[name] = {
                "counts": np.bincount(np.array(emitted), minlength=p.size).tolist(),
                "accepted": int(accept.sum().item()),
            }
        out[cfg["name"]] = res
    return out


def main() -> None:
    from pathlib import Path

    from mlx_lm.utils import load_model

    payload = read_payload()
    if payload.get("build"):
        from spec_common import build

        emit({"built": build(**payload["build"])})
        return
    config = {"keep_mtp": True} if payload.get("draft") is None and payload.get("mode") != "serial" else None
    target, _ = load_model(Path(payload["target"]), model_config=config or {})
    draft = load_model(Path(payload["draft"]))[0] if payload.get("draft") else None
    tic = time.perf_counter()
    out: dict[str, Any] = {
        "reference": _reference(payload, target, draft) if payload.get("reference") else None
    }
    if payload.get("mode") == "unit":
        out["unit"] = _unit(payload, target, draft)
    elif payload.get("mode"):
        out.update(_sample(payload, target, draft))
    out["seconds"] = time.perf_counter() - tic
    emit(out)


if __name__ == "__main__":
    main()
