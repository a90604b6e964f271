"""Probe: timed greedy decoding for scripts/bench_mlx.py, in one arm (one fresh process per measurement).

Payload: {"target": folder, "draft": folder | null, "modes": ["serial" | "spec" | "adaptive", ...],
"draft_kind": "model" | "mtp", "k": int, "prompts": [text, ...], "max_tokens": int, "warmup_tokens": int,
"temp": float (0: greedy; else make_sampler(temp), the random seed set to the prompt's index before every run)}.
Result: {"modes": {mode: {"runs": [{"tokens", "text", "n", "wall", "cpu", "stats"}]}}, "mlx_lm": version}:
``wall``/``cpu`` are the seconds from the first generated token to the last (decode only: prefill and the first
token excluded, as decode tok/s = (n - 1) / wall). After a warm-up generation of ``warmup_tokens`` tokens per mode,
every prompt is decoded once per mode, the modes interleaved prompt by prompt (rotated order), so modes of one
process are compared at nearly the same moment.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

import mlx.core as mx
from probe_io import emit, read_payload


def main() -> None:
    p = read_payload()
    from mlx_lm import load

    gen = importlib.import_module("mlx_lm.generate")
    mtp = p.get("draft_kind") == "mtp"
    model, tokenizer = load(p["target"], model_config={"keep_mtp": True}) if mtp else load(p["target"])
    draft = load(p["draft"])[0] if p.get("draft") else None

    temp = float(p.get("temp", 0.0))
    sampler = None
    if temp > 0:
        from mlx_lm.sample_utils import make_sampler

        sampler = make_sampler(temp)

    def tokens_of(mode: str, prompt_ids: list[int], n: int, stats: Any = None) -> Any:
        prompt = mx.array(prompt_ids)
        if mode == "serial":
            return ((t, False) for t, _ in gen.generate_step(prompt, model, max_tokens=n, sampler=sampler))
        kwargs: dict[str, Any] = {"sampler": sampler}
        if mode == "adaptive":
            kwargs["adaptive_draft"] = True
        if mtp:
            kwargs["draft_kind"] = "mtp"
        if stats is not None:
            kwargs["spec_stats"] = stats
        return (
            (t, f)
            for t, _, f in gen.speculative_generate_step(
                prompt, model, draft, num_draft_tokens=p["k"], max_tokens=n, **kwargs
            )
        )

    ids = [tokenizer.encode(text) for text in p["prompts"]]
    modes = p["modes"]
    for mode in modes:
        for _ in tokens_of(mode, ids[0], p.get("warmup_tokens", 16)):
            pass
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for j, prompt_ids in enumerate(ids):
        for mode in modes[j % len(modes) :] + modes[: j % len(modes)]:
            stats = (
                gen.SpeculativeStats("mtp" if mtp else "model")
                if (mode != "serial" and hasattr(gen, "SpeculativeStats"))
                else None
            )
            mx.random.seed(j)
            out: list[int] = []
            drafted = 0
            t0 = c0 = 0.0
            for i, (tok, from_draft) in enumerate(tokens_of(mode, prompt_ids, p["max_tokens"], stats)):
                out.append(int(tok))
                drafted += bool(from_draft)
                if i == 0:
                    t0, c0 = time.perf_counter(), time.process_time()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            runs[mode].append(
                {
                    "tokens": out,
                    "text": tokenizer.decode(out),
                    "n": len(out),
                    "wall": wall,
                    "cpu": cpu,
                    "from_draft": drafted,
                    "stats": stats.as_dict() if stats is not None else None,
                }
            )
    emit(
        {
            "modes": {m: {"runs": r} for m, r in runs.items()},
            "mlx_lm": importlib.import_module("mlx_lm").__version__,
        }
    )


if __name__ == "__main__":
    main()
