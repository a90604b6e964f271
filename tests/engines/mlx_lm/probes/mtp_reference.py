"""Probe: the patched MTP head on the trained tiny ``qwen3_5-mtp`` against the reference head, and greedy drafting.

Payload: {"model": model dir, "reference": folder holding ``mlx_mtp.py`` (overlay.check.models' reference MLX head),
"prompts": [text, ...] (encoded with the model's tokenizer), "max_tokens": N, "k": [draft lengths]}.

Result:
- "logits_max_abs" / "hidden_max_abs": per prompt, max |patched - reference| of the MTP logits and hidden states
  over all prompt positions (``model.mtp_forward`` on ``model(..., return_hidden=True)`` vs ``mlx_mtp.MTPHead``);
- "serial": greedy tokens of stock ``generate_step`` (the reference output);
- "spec": per k, the tokens of greedy decoding with ``model.mtp_forward`` drafts (k chained steps per cycle, the
  head's own KV cache trimmed after rejections), with drafted / accepted counts; and the same counts for the
  reference's own ``mlx_mtp.speculative_greedy``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
from probe_io import emit, log, read_payload


def serial(model: Any, prompt: list[int], max_tokens: int) -> list[int]:
    generate = importlib.import_module("mlx_lm.generate")
    out = []
    for token, _ in generate.generate_step(
        mx.array(prompt), model, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, axis=-1)
    ):
        out.append(int(token))
    return out


def mtp_greedy(model: Any, prompt: list[int], max_tokens: int, k: int) -> dict[str, Any]:
    """Greedy decoding, drafts from ``model.mtp_forward``; the target recomputes the whole sequence each cycle
    (obviously right), the MTP head keeps its cache: entries (hidden[t], token[t + 1]) at position t, with the
    chained-draft entries trimmed away before the next cycle feeds the accepted pairs."""
    seq = list(prompt)
    logits, hidden = model(mx.array([seq]), return_hidden=True)
    y = int(mx.argmax(logits[0, -1]).item())
    out = [y]
    cache = model.make_mtp_cache()
    fed = 0  # pairs (hidden[t], seq[t + 1]) in the MTP cache, t < fed
    drafted = accepted = cycles = 0
    while len(out) < max_tokens:
        n = len(seq)
        if fed < n - 1:  # catch up with the pairs the target has confirmed
            model.mtp_forward(hidden[:, fed : n - 1], mx.array([seq[fed + 1 : n]]), cache)
            fed = n - 1
        kk = min(k, max_tokens - len(out))
        h, token, drafts = hidden[:, n - 1 : n], mx.array([[y]]), []
        for step in range(kk):
            step_logits, h = model.mtp_forward(h, token, cache, step=step)
            token = mx.argmax(step_logits[:, -1:], axis=-1)
            drafts.append(int(token.item()))
        for c in cache:  # keep (hidden[n - 1], y) at position n - 1, drop the chained entries
            c.trim(kk - 1)
        fed = n
        logits, hidden = model(mx.array([seq + [y] + drafts]), return_hidden=True)
        verify = [int(t) for t in mx.argmax(logits[0, n:], axis=-1).tolist()]
        m = 0
        while m < kk and verify[m] == drafts[m]:
            m += 1
        cycles += 1
        drafted += kk
        accepted += m
        seq = seq + [y] + drafts[:m]
        y = verify[m]
        out.extend(drafts[:m])
        out.append(y)
    return {"tokens": out[:max_tokens], "drafted": drafted, "accepted": accepted, "cycles": cycles}


def main() -> None:
    payload = read_payload()
    sys.path.insert(0, payload["reference"])
    import mlx_mtp  # the tiny models' reference head (imports only mlx and mlx_lm)
    from mlx_lm.utils import load_model, load_tokenizer

    model_dir = Path(payload["model"])
    model, config = load_model(model_dir, model_config={"keep_mtp": True})
    reference = mlx_mtp.load_head(model, str(model_dir / "model.safetensors"), config)
    tokenizer = load_tokenizer(model_dir)
    prompts = [tokenizer.encode(text) for text in payload["prompts"]]
    result: dict[str, Any] = {
        "logits_max_abs": [],
        "hidden_max_abs": [],
        "serial": [],
        "spec": {},
        "prompts": prompts,
    }
    for prompt in prompts:
        tokens = mx.array([prompt])
        _, hidden = model(tokens, return_hidden=True)
        h, nxt = hidden[:, :-1], tokens[:, 1:]
        logits, g = model.mtp_forward(h, nxt)
        g_ref = reference(h, mlx_mtp.embed(model, nxt))
        logits_ref = mlx_mtp.lm_head(model, g_ref)
        result["logits_max_abs"].append(mx.abs(logits - logits_ref).max().item())
        result["hidden_max_abs"].append(mx.abs(g - g_ref).max().item())
        result["serial"].append(serial(model, prompt, payload["max_tokens"]))
    for k in payload["k"]:
        log(f"mtp_reference: k={k}")
        runs = [mtp_greedy(model, p, payload["max_tokens"], k) for p in prompts]
        refs = [
            mlx_mtp.speculative_greedy(model, reference, p, max_tokens=payload["max_tokens"], k=k)
            for p in prompts
        ]
        result["spec"][str(k)] = {
            "tokens": [r["tokens"] for r in runs],
            "drafted": sum(r["drafted"] for r in runs),
            "accepted": sum(r["accepted"] for r in runs),
            "reference_tokens": [r["tokens"] for r in refs],
            "reference_drafted": sum(r["drafted"] for r in refs),
            "reference_accepted": sum(r["accepted"] for r in refs),
        }
    emit(result)


if __name__ == "__main__":
    main()
