"""Probe: the distribution of sampled (temp > 0) speculative decoding, against the exact serial distribution.

Payload: {"target": folder, "draft": folder | null (null: ``draft_kind="mtp"``, target loaded with keep_mtp),
"prompt": [ids] (or "prompt_text": a text the target's tokenizer encodes), "k": drafts per cycle, "runs": seeds per
config, "positions": output positions counted (default 2; each run generates that many tokens), "prune": see
``reference``, "configs": [config, ...], "reference": bool, "mode": "spec" | "exact" | "wrong" | "serial" | "unit" |
"stale_state" | "mtp_reference", "no_step_capture": bool (hybrid targets: roll back by restore + replay, not from
per-token states), "unit_rows": rows of the unit mode, "build": {build() arguments} | null (write a model first: the
drafter of this test, made by the stock arm)}. A config: {"name", "temp", "top_p", "top_k", "min_p",
"repetition_penalty"} (make_sampler / make_logits_processors arguments).

- ``reference`` (run it in the stock arm): the exact distributions of serial sampling at output positions 0 ..
  positions - 1, written from stock's sampler definition (log-softmax, then the filters top-p -> min-p -> top-k of
  stock ``make_sampler``, then the temperature; logits processors before all), with the stock filter functions;
  position j is the marginal over every earlier token sequence (batched forwards over all of them; sequences whose
  probability is under ``prune``, default ``PRUNE``, are not followed: the mass left out shows as a sum under 1).
  Also the drafter's distribution at position 0, and the expected acceptance of the first draft ``sum(min(p, q))``
  (and ``sum(p * q)``, the expected acceptance of an exact-match verify, which draws the target's token
  independently).
- ``mode`` (``runs`` seeds, ``positions`` tokens each): ``serial`` stock ``generate_step``; ``spec``
  ``speculative_generate_step`` with the sampler as given; ``exact`` the same with the sampler wrapped in a plain
  function (no known distribution: the exact-match acceptance of today); ``wrong`` rejection sampling with a
  deliberately wrong residual (a rejected position is resampled from ``p`` instead of ``max(0, p - q)``), to show the
  test has power; ``stale_state`` a hybrid target whose rollback restores its attention caches but leaves the
  recurrent (``ArraysCache``) state as the rejected drafts left it (use with ``no_step_capture``: the restore path);
  ``unit`` ``speculative_accept`` itself (and the wrong variant) on ``unit_rows`` independent copies of position 0 at
  once (drafts drawn from ``q``; vectorised, so the test can afford many samples): the emitted token counts and the
  number of accepted drafts; ``mtp_reference`` (patched arm, ``draft`` null): the MTP head's distribution at its first
  draft (output position 1, from the target's hidden state at the last prompt token and the token at position 0,
  the head's cache holding the prompt, as the generator feeds it) and the expected acceptance of that draft,
  ``sum over x0 of p0(x0) * sum(min(p1(.|x0), q1(.|x0)))`` (and the exact-match ``sum(p1 * q1)`` likewise).

Result: {"reference": {...} | null, "counts": {config: [[count per token] per position]},
"first_accept": {config: accepted first drafts}, "first_drafted": {config: cycles with a first draft}, "mtp": {config:
{"accept_min", "accept_exact", "q1", "wrong1"}} (mode mtp_reference; ``wrong1``: what the wrong residual emits at
position 1), "prompt": the ids used, "seconds"}.
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


def _probs_rows(cfg: dict[str, Any], contexts: list[list[int]], logits: mx.array) -> np.ndarray:
    """Serial sampling's distributions for rows of logits (B x V), row i after ``contexts[i]``, from stock's
    definition (stock's filter functions work row by row on a batch; the processors see one context each)."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    procs = _processors(cfg)
    if procs:
        rows = []
        for i, context in enumerate(contexts):
            row = logits[i : i + 1]
            for proc in procs:
                row = proc(mx.array(context, mx.uint32), row)
            rows.append(row)
        logits = mx.concatenate(rows, axis=0)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if 0 < cfg.get("top_p", 0.0) < 1.0:
        lp = apply_top_p(lp, cfg["top_p"])
    if cfg.get("min_p", 0.0):
        lp = apply_min_p(lp, cfg["min_p"])
    if cfg.get("top_k", 0) > 0:
        lp = apply_top_k(lp, cfg["top_k"])
    p = mx.softmax(lp.astype(mx.float32) * (1.0 / cfg["temp"]), axis=-1)
    return np.array(p, dtype=np.float64)


def _probs(cfg: dict[str, Any], context: list[int], logits: mx.array) -> np.ndarray:
    """Serial sampling's distribution for one row of logits (1 x V)."""
    row: np.ndarray = _probs_rows(cfg, [context], logits)[0]
    return row


def _last_logits(model: Any, rows: list[list[int]]) -> mx.array:
    chunks = [model(mx.array(rows[i : i + CHUNK], mx.uint32))[:, -1, :] for i in range(0, len(rows), CHUNK)]
    return mx.concatenate(chunks, axis=0).astype(mx.float32)


# Token sequences less likely than this are not followed in the marginals (payload "prune").
PRUNE = 1e-9
CHUNK = 512


def _marginals(
    cfg: dict[str, Any], target: Any, prompt: list[int], positions: int, prune: float
) -> list[np.ndarray]:
    """Serial sampling's marginal distribution at output positions 0 .. positions - 1: every token sequence whose
    probability is above ``prune`` is followed (the mass left out shows as a sum under 1)."""
    beams: list[tuple[list[int], float]] = [(prompt, 1.0)]
    out: list[np.ndarray] = []
    for _ in range(positions):
        contexts = [ctx for ctx, _ in beams]
        weights = np.array([w for _, w in beams])[:, None]
        probs = np.concatenate(
            [
                _probs_rows(cfg, contexts[i : i + CHUNK], _last_logits(target, contexts[i : i + CHUNK]))
                for i in range(0, len(contexts), CHUNK)
            ]
        )
        joint = weights * probs
        out.append(joint.sum(axis=0))
        rows, tokens = np.nonzero(joint > prune)
        beams = [(contexts[r] + [int(t)], float(joint[r, t])) for r, t in zip(rows, tokens)]
    return out


def _reference(payload: dict[str, Any], target: Any, draft: Any) -> dict[str, Any]:
    prompt = payload["prompt"]
    out: dict[str, Any] = {}
    for cfg in payload["configs"]:
        marginals = _marginals(cfg, target, prompt, payload.get("positions", 2), payload.get("prune", PRUNE))
        ref: dict[str, Any] = {f"p{j}": m.tolist() for j, m in enumerate(marginals)}
        if draft is not None:
            p0 = marginals[0]
            q0 = _probs(cfg, prompt, _last_logits(draft, [prompt]))
            ref.update(
                q0=q0.tolist(),
                accept_min=float(np.minimum(p0, q0).sum()),
                accept_exact=float((p0 * q0).sum()),
            )
        out[cfg["name"]] = ref
    return out


def _mtp_reference(payload: dict[str, Any], target: Any) -> dict[str, Any]:
    """The MTP head's first draft (output position 1): its distribution given each token x0 at position 0 and the
    expected acceptance of that draft, averaged over x0 ~ p0."""
    prompt = payload["prompt"]
    n = len(prompt)
    out: dict[str, Any] = {}
    _, hidden = target(mx.array([prompt], mx.uint32), return_hidden=True)
    for cfg in payload["configs"]:
        p0 = _probs(cfg, prompt, _last_logits(target, [prompt]))
        firsts = [int(x) for x in np.nonzero(p0 > PRUNE)[0]]
        accept_min = accept_exact = 0.0
        q1_mean = np.zeros_like(p0)
        wrong1 = np.zeros_like(p0)
        for i in range(0, len(firsts), CHUNK):
            block = firsts[i : i + CHUNK]
            contexts = [prompt + [x] for x in block]
            p1 = _probs_rows(cfg, contexts, _last_logits(target, contexts))
            # The head sees (hidden[t], token[t + 1]) for every prompt position, then (hidden[n - 1], x0): one
            # uncached pass over the whole sequence (the generator's cached passes agree within 4e-7).
            tokens = mx.array([prompt[1:] + [x] for x in block], mx.uint32)
            logits, _ = target.mtp_forward(mx.broadcast_to(hidden, (len(block), n, hidden.shape[-1])), tokens)
            q1 = _probs_rows(cfg, contexts, logits[:, -1, :].astype(mx.float32))
            w = p0[block][:, None]
            accept_min += float((w * np.minimum(p1, q1)).sum())
            accept_exact += float((w * p1 * q1).sum())
            q1_mean += (w * q1).sum(axis=0)
            # What the wrong residual (a rejection resampled from p) emits there: min(p, q) + (1 - A) p.
            reject = 1.0 - np.minimum(p1, q1).sum(axis=-1, keepdims=True)
            wrong1 += (w * (np.minimum(p1, q1) + reject * p1)).sum(axis=0)
        out[cfg["name"]] = {
            "accept_min": accept_min,
            "accept_exact": accept_exact,
            "q1": q1_mean.tolist(),
            "wrong1": wrong1.tolist(),
        }
    return out


def _stale_state_restore(gen: Any) -> None:
    """A rollback that restores the attention caches but not the recurrent state (ArraysCache), for the test's
    negative control."""
    from mlx_lm.models.cache import ArraysCache, CacheList

    original = gen.restore_prompt_cache

    def keep_arrays(c: Any, s: Any) -> Any:
        if isinstance(c, CacheList):
            return [keep_arrays(x, xs) for x, xs in zip(c.caches, s)]
        return list(c.cache) if isinstance(c, ArraysCache) else s

    def restore(cache: list[Any], snapshot: list[Any]) -> None:
        original(cache, [keep_arrays(c, s) for c, s in zip(cache, snapshot)])

    gen.restore_prompt_cache = restore


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
    positions = payload.get("positions", 2)
    prompt = mx.array(payload["prompt"], mx.uint32)
    vocab = int(_last_logits(target, [payload["prompt"]]).shape[-1])
    counts: dict[str, Any] = {}
    first_accept: dict[str, int] = {}
    first_drafted: dict[str, int] = {}
    if mode == "wrong":
        gen.speculative_accept = _wrong_accept
    if mode == "stale_state":
        _stale_state_restore(gen)
    for cfg in payload["configs"]:
        sampler = _sampler(cfg)
        if mode == "exact":
            plain = sampler

            def sampler(lp: mx.array, plain: Any = plain) -> mx.array:
                return plain(lp)

        hist: list[dict[int, int]] = [{} for _ in range(positions)]
        accepted = drafted = 0
        for seed in range(payload["runs"]):
            mx.random.seed(seed)
            procs = _processors(cfg)
            if mode == "serial":
                steps = gen.generate_step(
                    prompt, target, max_tokens=positions, sampler=sampler, logits_processors=procs
                )
                toks = [(int(t), False) for t, _ in steps]
            else:
                kwargs: dict[str, Any] = {"draft_kind": "mtp"} if draft is None else {}
                steps = gen.speculative_generate_step(
                    prompt,
                    target,
                    draft,
                    num_draft_tokens=payload["k"],
                    max_tokens=positions,
                    sampler=sampler,
                    logits_processors=procs,
                    **kwargs,
                )
                toks = [(int(t), bool(d)) for t, _, d in steps]
            for pos, (tok, _) in enumerate(toks[:positions]):
                hist[pos][tok] = hist[pos].get(tok, 0) + 1
            # The first drafted position: token 0 of a model drafter's first cycle, token 1 for MTP (its first
            # token is a plain step).
            at = 0 if draft is not None else 1
            if mode != "serial" and len(toks) > at:
                drafted += 1
                accepted += int(toks[at][1])
        counts[cfg["name"]] = [[h.get(i, 0) for i in range(vocab)] for h in hist]
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
    if payload.get("prompt_text") is not None:
        from mlx_lm.utils import load_tokenizer

        payload["prompt"] = load_tokenizer(Path(payload["target"])).encode(payload["prompt_text"])
    if payload.get("build"):
        from spec_common import build

        emit({"built": build(**payload["build"])})
        return
    mode = payload.get("mode")
    config = {"keep_mtp": True} if payload.get("draft") is None and mode not in ("serial", None) else None
    target, _ = load_model(Path(payload["target"]), model_config=config or {})
    draft = load_model(Path(payload["draft"]))[0] if payload.get("draft") else None
    undo = None
    if payload.get("no_step_capture"):
        from spec_hooks import without_step_capture

        undo = without_step_capture()
    tic = time.perf_counter()
    out: dict[str, Any] = {
        "reference": _reference(payload, target, draft) if payload.get("reference") else None
    }
    if mode == "unit":
        out["unit"] = _unit(payload, target, draft)
    elif mode == "mtp_reference":
        out["mtp"] = _mtp_reference(payload, target)
    elif mode:
        out.update(_sample(payload, target, draft))
    out["seconds"] = time.perf_counter() - tic
    out["prompt"] = payload["prompt"]
    if undo is not None:
        undo()
    emit(out)


if __name__ == "__main__":
    main()
