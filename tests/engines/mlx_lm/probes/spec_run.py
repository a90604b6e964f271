"""Probe: run speculative (and serial) greedy decoding cases through one arm's mlx-lm.

Payload: {"cases": [case, ...]}. A case:
  {"id", "api": "serial" | "spec" | "stream" | "text_ids" | "rollback_unit" | "ring_unit" | "capture_unit",
   "target": folder, "target_config": {...} (load model_config),
   "draft": folder | null, "k": num_draft_tokens, "max_tokens", "prompts": [[token ids], ...],
   "kwargs": {...} (extra keyword arguments of generate_step / speculative_generate_step / stream_generate),
   "processors": {...} | null (make_logits_processors arguments, a fresh list per prompt),
   "cache": null | {"max_kv_size": target window or null, "draft": "rotating" | "ring", "window": W, "slack": S}
   (an explicit prompt_cache: the target's cache plus one draft cache per draft layer),
   "stats": bool (pass a SpeculativeStats where this arm has one),
   "no_step_capture": bool (the gated-delta layers record no per-token states: hybrid rollback by replay)}
Result: {"cases": {id: {"runs": [{"tokens", "from_draft", "stats", "offsets", "draft_slots"}, ...]} or
{"error": "Type: message"}}}. Only the public API is used, so the same case runs in both arms where it exists.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import mlx.core as mx
from probe_io import emit, log, read_payload
from spec_hooks import without_step_capture

_MODELS: dict[tuple[str, str], tuple[Any, Any]] = {}


def _load(path: str, config: dict[str, Any] | None) -> tuple[Any, Any]:
    import json

    key = (path, json.dumps(config or {}, sort_keys=True))
    if key not in _MODELS:
        from mlx_lm import load

        _MODELS[key] = load(path, model_config=config) if config else load(path)
    return _MODELS[key]


def _offset(c: Any) -> int:
    if hasattr(c, "caches"):
        return _offset(c.caches[0])
    return int(getattr(c, "offset", -1))


def _prompt_cache(spec: dict[str, Any], target: Any, draft: Any) -> list[Any]:
    import mlx_lm.models.cache as C

    cache: list[Any] = C.make_prompt_cache(target, max_kv_size=spec.get("max_kv_size"))
    kind = spec.get("draft")
    if kind is None:
        draft_cache: list[Any] = C.make_prompt_cache(draft)
        return cache + draft_cache
    if kind == "rotating":
        return cache + [C.RotatingKVCache(spec["window"]) for _ in draft.layers]
    if kind == "ring":
        if not hasattr(C, "DraftRingKVCache"):
            raise NotImplementedError("this mlx-lm has no DraftRingKVCache")
        return cache + [C.DraftRingKVCache(spec["window"], spec.get("slack", 16)) for _ in draft.layers]
    raise ValueError(f"unknown draft cache kind {kind!r}")


def _states(cache: list[Any]) -> list[Any]:
    """Comparable arrays of a cache list: ArraysCache slots, KV keys/values up to the offset."""
    out: list[Any] = []
    for c in cache:
        if hasattr(c, "caches"):
            out += _states(list(c.caches))
        elif hasattr(c, "cache") and isinstance(c.cache, list):
            out += [x for x in c.cache if x is not None]
        else:
            out += [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]]
    return out


def _rollback_unit(case: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """Snapshots before each of 4 single-token steps, restore the one before step 2: the state must equal that
    of a second cache that only ever saw the first two steps."""
    import mlx_lm.models.cache as C

    model, _ = _load(case["target"], None)
    steps = mx.array(ids[-1:] + [3, 5, 7])
    window = case.get("max_kv_size")  # rotating layers: full-window single-token steps write in place
    caches = [C.make_prompt_cache(model, max_kv_size=window), C.make_prompt_cache(model, max_kv_size=window)]
    for c in caches:
        model(mx.array(ids[:-1])[None], cache=c)
    snaps = []
    for j in range(4):
        snaps.append(C.snapshot_prompt_cache(caches[0]))
        model(steps[j : j + 1][None], cache=caches[0])
    mx.eval([x for c in caches[0] for x in _states([c])])
    C.restore_prompt_cache(caches[0], snaps[2])
    for j in range(2):
        model(steps[j : j + 1][None], cache=caches[1])
    a, b = _states(caches[0]), _states(caches[1])
    diff = max(float(mx.abs(x - y).max()) for x, y in zip(a, b))
    offsets = [_offset(c) for c in caches[0] if not hasattr(c, "cache")]
    ref = [_offset(c) for c in caches[1] if not hasattr(c, "cache")]
    return {"max_abs_diff": diff, "restored_offset": offsets, "reference_offset": ref, "arrays": len(a)}


def _capture_unit(case: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """A 4-token update with per-token states recorded, rolled back to its first t tokens, against a cache that
    only ever saw those t tokens (one call): max |diff| of the gated-delta states, for t = 1..3."""
    import mlx_lm.models.cache as C

    model, _ = _load(case["target"], None)
    steps = mx.array(ids[-1:] + [3, 5, 7])
    out = {}
    for t in (1, 2, 3):
        caches = [C.make_prompt_cache(model), C.make_prompt_cache(model)]
        for c in caches:
            model(mx.array(ids[:-1])[None], cache=c)
        arrays = [c for c in caches[0] if isinstance(c, C.ArraysCache)]
        for c in arrays:
            c.capture_steps = True
        model(steps[None], cache=caches[0])
        for c in arrays:
            c.capture_steps = False
        recorded = all(c.rewind_to_step(t) for c in arrays)
        model(steps[:t][None], cache=caches[1])
        a = [x for c in caches[0] if isinstance(c, C.ArraysCache) for x in c.cache]
        b = [x for c in caches[1] if isinstance(c, C.ArraysCache) for x in c.cache]
        out[str(t)] = {
            "recorded": recorded,
            "max_abs_diff": max(float(mx.abs(x - y).max()) for x, y in zip(a, b)),
        }
    return out


def _ring_unit(case: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """A draft model on a DraftRingKVCache under a random pattern of writes and trims (trims <= slack): after each
    write the last logits must equal those of serial decoding of the kept tokens with RotatingKVCache(window)."""
    import random

    import mlx_lm.models.cache as C

    model, _ = _load(case["target"], None)
    window, slack = case["window"], case["slack"]
    rng = random.Random(len(ids))
    cache = [C.DraftRingKVCache(window, slack) for _ in model.layers]
    history: list[int] = []
    worst, checks, largest = 0.0, 0, 0

    def write(tokens: list[int]) -> None:
        nonlocal worst, checks, largest
        out = model(mx.array(tokens)[None], cache=cache)[0, -1]
        history.extend(tokens)
        ref_cache = [C.RotatingKVCache(window) for _ in model.layers]
        for t in history:
            ref = model(mx.array([[t]]), cache=ref_cache)[0, -1]
        worst = max(worst, float(mx.abs(out - ref).max()))
        checks += 1
        largest = max(largest, int(cache[0].keys.shape[2]))

    write(ids)
    for _ in range(case.get("rounds", 12)):
        for _ in range(rng.randint(1, 4)):
            write([rng.randrange(1, 255)])
        n = rng.randint(0, min(slack, len(history) - 1, 3))
        for c in cache:
            c.trim(n)
        del history[len(history) - n :]
        if rng.random() < 0.3:
            write([rng.randrange(1, 255) for _ in range(rng.choice([2, slack + 3]))])
    return {
        "max_abs_diff": worst,
        "checks": checks,
        "slots": largest,
        "offset": cache[0].offset,
        "history": len(history),
    }


def _run_one(case: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    gen = sys.modules.get("mlx_lm.generate") or __import__("importlib").import_module("mlx_lm.generate")
    if case["api"] == "rollback_unit":
        return _rollback_unit(case, ids)
    if case["api"] == "ring_unit":
        return _ring_unit(case, ids)
    if case["api"] == "capture_unit":
        return _capture_unit(case, ids)
    target, tokenizer = _load(case["target"], case.get("target_config"))
    draft = _load(case["draft"], None)[0] if case.get("draft") else None
    kwargs = dict(case.get("kwargs") or {})
    if case.get("processors"):
        from mlx_lm.sample_utils import make_logits_processors

        kwargs["logits_processors"] = make_logits_processors(**case["processors"])
    stats = None
    if case.get("stats") and hasattr(gen, "SpeculativeStats"):
        stats = gen.SpeculativeStats(kwargs.get("draft_kind", "model"))
        kwargs["spec_stats"] = stats
    cache = None
    if case.get("cache") is not None:
        cache = _prompt_cache(case["cache"], target, draft)
        kwargs["prompt_cache"] = cache
    api = case["api"]
    if api == "text_ids":  # a text prompt, tokenized here; spec when the case has k, else serial
        ids = tokenizer.encode(ids)
        api = "spec" if case.get("k") else "serial"
    prompt = mx.array(ids)
    tokens: list[int] = []
    flags: list[bool] = []
    if api == "serial":
        for tok, _ in gen.generate_step(prompt, target, max_tokens=case["max_tokens"], **kwargs):
            tokens.append(int(tok))
            flags.append(False)
    elif api == "spec":
        for tok, _, from_draft in gen.speculative_generate_step(
            prompt, target, draft, num_draft_tokens=case["k"], max_tokens=case["max_tokens"], **kwargs
        ):
            tokens.append(int(tok))
            flags.append(bool(from_draft))
    elif api == "stream":
        last = None
        for resp in gen.stream_generate(
            target,
            tokenizer,
            ids,
            max_tokens=case["max_tokens"],
            draft_model=draft,
            num_draft_tokens=case.get("k", 2),
            **kwargs,
        ):
            tokens.append(int(resp.token))
            flags.append(bool(resp.from_draft))
            last = resp
        stats = getattr(last, "spec_stats", None)
        return {
            "tokens": tokens,
            "from_draft": flags,
            "stats": stats,
            "has_field": last is not None and hasattr(last, "spec_stats"),
        }
    else:
        raise ValueError(f"unknown api {api!r}")
    out: dict[str, Any] = {
        "tokens": tokens,
        "from_draft": flags,
        "stats": stats.as_dict() if stats is not None else None,
    }
    if cache is not None:
        n = len(target.layers)
        out["offsets"] = {"target": _offset(cache[0]), "draft": _offset(cache[n]) if len(cache) > n else None}
        keys = getattr(cache[-1], "keys", None)
        out["draft_slots"] = (
            int(keys.shape[2]) if keys is not None and not isinstance(keys, (list, tuple)) else None
        )
    return out


def main() -> None:
    payload = read_payload()
    results: dict[str, Any] = {}
    for case in payload["cases"]:
        undo = without_step_capture() if case.get("no_step_capture") else None
        try:
            results[case["id"]] = {"runs": [_run_one(case, ids) for ids in case["prompts"]]}
        except Exception as exc:
            log(traceback.format_exc())
            results[case["id"]] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            if undo is not None:
                undo()
    emit({"cases": results})


if __name__ == "__main__":
    main()
