# mypy: disable-error-code="import-not-found"
"""Probe (runs in an interpreter with torch + transformers, e.g. the sglang deps venv): load llama tiny models with
``AutoModelForCausalLM`` / ``AutoTokenizer`` as SGLang does, report the prompt's last-position logits.

stdin: {"models": [DIR, ...], "prompt": TEXT}
stdout: {DIR: {"finite": bool, "prompt_ids": [...], "last_logits": [...], "architecture": NAME}}
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def probe(path: str, prompt: str) -> dict[str, object]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    return {
        "finite": bool(torch.isfinite(logits).all()),
        "prompt_ids": list(ids),
        "last_logits": logits[0, -1].tolist(),
        "architecture": type(model).__name__,
        "roundtrip": tokenizer.decode(ids, skip_special_tokens=True) == prompt,
    }


def main() -> int:
    req = json.loads(sys.stdin.read())
    print(json.dumps({path: probe(path, req["prompt"]) for path in req["models"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
