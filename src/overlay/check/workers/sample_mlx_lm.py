"""Sampled generation in an mlx-lm arm for the check's distribution test (stdin/stdout JSON; not imported by overlay).

Request: {"model", "prompts": [[ids]], "temperature", "top_k", "seeds": [int], "positions": P, "options"?}. Result:
{"tokens": [prompt][seed] -> the first P sampled tokens, "options": {"applied", "unused"}}, each seed reseeding mlx's
generator before its run. Public API only (mlx_lm.load, generate_step, sample_utils.make_sampler), so the same script
drives the stock and the patched engine. ``options`` (CLI-style, ``--max-kv-size=64``) become generate_step keyword
arguments where it takes one of that name, the rule of engines/workers/mlx_lm_options.py.
"""

import inspect
import json
import sys
from typing import Any


def _kwargs(options: dict[str, Any], fn: Any) -> tuple[dict[str, Any], dict[str, str]]:
    params = set(inspect.signature(fn).parameters) - {"max_tokens", "sampler", "kwargs"}
    kwargs: dict[str, Any] = {}
    unused: dict[str, str] = {}
    for name, raw in options.items():
        key = name.lstrip("-").replace("-", "_")
        if key not in params:
            unused[name] = f"generate_step takes no {key} (or the sampler sets it)"
            continue
        try:
            kwargs[key] = True if raw is None else json.loads(raw)
        except (TypeError, ValueError):
            kwargs[key] = raw
    return kwargs, unused


def main() -> None:
    req = json.loads(sys.stdin.read())
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    model, _tok = load(req["model"])
    sampler = make_sampler(temp=float(req["temperature"]), top_k=int(req.get("top_k") or 0))
    n = int(req["positions"])
    options = req.get("options") or {}
    kwargs, unused = _kwargs(options, generate_step)
    out: list[Any] = []
    for ids in req["prompts"]:
        per_seed: list[list[int]] = []
        for seed in req["seeds"]:
            mx.random.seed(int(seed))
            toks: list[int] = []
            for tok, _lp in generate_step(mx.array(ids), model, max_tokens=n, sampler=sampler, **kwargs):
                toks.append(int(tok.item() if hasattr(tok, "item") else tok))
                if len(toks) >= n:
                    break
            per_seed.append(toks)
        out.append(per_seed)
    applied = {k: v for k, v in options.items() if k not in unused}
    print(json.dumps({"tokens": out, "options": {"applied": applied, "unused": unused}}))


if __name__ == "__main__":
    main()
