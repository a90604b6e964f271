# mypy: disable-error-code="import-not-found"
"""Probe (runs in an interpreter with stock mlx-lm): load tiny models with ``mlx_lm.load`` and report logits.

stdin: {"models": [DIR, ...], "prompt": TEXT, "generate": N, "roundtrip": [TEXT, ...]}
stdout: one JSON document, per DIR: finite (bool), shape, parameters, param_names, last_logits (the prompt's last
position), greedy (N token ids from stock ``generate_step``), prompt_ids, eos_token_ids, caches (class names),
roundtrip_ok (the HF tokenizer decodes its own encoding of every text back unchanged).
"""

from __future__ import annotations

import importlib
import json
import sys

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache


def probe(path: str, prompt: str, n_generate: int, texts: list[str]) -> dict[str, object]:
    model, tokenizer = load(path)
    ids = tokenizer.encode(prompt)
    logits = model(mx.array([ids]))
    mx.eval(logits)
    generate = importlib.import_module("mlx_lm.generate")
    greedy = [
        int(t)
        for t, _ in generate.generate_step(
            mx.array(ids), model, max_tokens=n_generate, sampler=lambda x: mx.argmax(x, axis=-1)
        )
    ]
    params = tree_flatten(model.parameters())
    return {
        "finite": bool(mx.all(mx.isfinite(logits)).item()),
        "shape": list(logits.shape),
        "parameters": int(sum(v.size for _, v in params)),
        "param_names": [name for name, _ in params],
        "last_logits": [float(x) for x in logits[0, -1].tolist()],
        "greedy": greedy,
        "decoded": tokenizer.decode(greedy),
        "prompt_ids": ids,
        "eos_token_ids": sorted(tokenizer.eos_token_ids),
        "caches": [type(c).__name__ for c in make_prompt_cache(model)],
        "roundtrip_ok": all(
            tokenizer.decode(tokenizer.encode(t), skip_special_tokens=True) == t for t in texts
        ),
    }


def main() -> int:
    req = json.loads(sys.stdin.read())
    out = {
        path: probe(path, req["prompt"], int(req.get("generate", 8)), req.get("roundtrip", []))
        for path in req["models"]
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
