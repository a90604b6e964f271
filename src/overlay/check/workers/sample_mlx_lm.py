"""Sampled generation in an mlx-lm arm for the check's distribution test (stdin/stdout JSON; not imported by overlay).

Request: {"model", "prompts": [[ids]], "temperature", "top_k", "seeds": [int], "positions": P}. Result: {"tokens":
[prompt][seed] -> the first P sampled tokens}, each seed reseeding mlx's generator before its run. Public API only
(mlx_lm.load, generate_step, sample_utils.make_sampler), so the same script drives the stock and the patched engine.
"""

import json
import sys
from typing import Any


def main() -> None:
    req = json.loads(sys.stdin.read())
    import mlx.core as mx  # type: ignore[import-not-found]
    from mlx_lm import load  # type: ignore[import-not-found]
    from mlx_lm.generate import generate_step  # type: ignore[import-not-found]
    from mlx_lm.sample_utils import make_sampler  # type: ignore[import-not-found]

    model, _tok = load(req["model"])
    sampler = make_sampler(temp=float(req["temperature"]), top_k=int(req.get("top_k") or 0))
    n = int(req["positions"])
    out: list[Any] = []
    for ids in req["prompts"]:
        per_seed: list[list[int]] = []
        for seed in req["seeds"]:
            mx.random.seed(int(seed))
            toks: list[int] = []
            for tok, _lp in generate_step(mx.array(ids), model, max_tokens=n, sampler=sampler):
                toks.append(int(tok.item() if hasattr(tok, "item") else tok))
                if len(toks) >= n:
                    break
            per_seed.append(toks)
        out.append(per_seed)
    print(json.dumps({"tokens": out}))


if __name__ == "__main__":
    main()
