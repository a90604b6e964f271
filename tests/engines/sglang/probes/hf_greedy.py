"""Probe: greedy decoding of a token prompt with HF transformers (reference for the CPU engine harness).

Payload ``{"model": DIR, "prompt": [ids], "max_new_tokens": N}``; prints ``{"output_ids": [...]}``.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main() -> int:
    payload = json.load(sys.stdin)
    model = AutoModelForCausalLM.from_pretrained(payload["model"], torch_dtype=torch.float32)
    model.eval()
    ids = torch.tensor([payload["prompt"]])
    n = int(payload["max_new_tokens"])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)
    sys.stdout.write(json.dumps({"output_ids": out[0, ids.shape[1] :].tolist()}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
