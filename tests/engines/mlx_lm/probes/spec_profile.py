"""Probe: where adaptive speculative decoding spends its time when drafting cannot pay (patched arm; scripts).

Payload: {"target": folder, "draft": folder, "prompts": [text, ...], "max_tokens": int, "k": int, "reps": int,
"modes": ["serial" | "adaptive" | "never", ...]}. ``serial``: ``generate_step``; ``adaptive``:
``speculative_generate_step(adaptive_draft=True)``; ``never``: the same with a controller that never drafts (only
its serial steps: the per-token cost of the speculative generator's serial path). Modes run interleaved, prompt by
prompt, ``reps`` times, greedy.

Result: {"modes": {mode: {"seconds", "tokens", "tok_s", "runs": [[gap seconds between consecutive tokens]...],
"events": [[controller events]...] (adaptive: ["serial", n] and ["cycle", k, accepted, seconds])}}}.
"""

from __future__ import annotations

import importlib
import itertools
import time
from typing import Any

import mlx.core as mx
from probe_io import emit, read_payload


def main() -> None:
    p = read_payload()
    from mlx_lm import load

    gen = importlib.import_module("mlx_lm.generate")
    model, tokenizer = load(p["target"])
    draft = load(p["draft"])[0]
    ids = [tokenizer.encode(t) for t in p["prompts"]]
    events: list[list[Any]] = []

    class Logged(gen.SpeculativeController):  # type: ignore[misc, name-defined]
        def serial_tokens(self, remaining: Any = None) -> int:
            n = int(super().serial_tokens(remaining))
            if n:
                events.append(["serial", n])
            return n

        def record_cycle(
            self, k: int, accepted: int, seconds: float, draft_seconds: Any = None, **kw: Any
        ) -> None:
            events.append(["cycle", k, accepted, seconds])
            super().record_cycle(k, accepted, seconds, draft_seconds, **kw)

    class Never(gen.SpeculativeController):  # type: ignore[misc, name-defined]
        def serial_tokens(self, remaining: Any = None) -> int:
            return int(remaining or 1 << 30)

    def run(mode: str, prompt: list[int], n: int) -> Any:
        x = mx.array(prompt)
        if mode == "serial":
            return (t for t, _ in gen.generate_step(x, model, max_tokens=n))
        ctrl = Logged(p["k"]) if mode == "adaptive" else Never(p["k"])
        return (
            t
            for t, _, _ in gen.speculative_generate_step(
                x, model, draft, num_draft_tokens=p["k"], max_tokens=n, adaptive_draft=ctrl
            )
        )

    modes = p["modes"]
    for mode in modes:
        for _ in run(mode, ids[0], 16):
            pass
    out: dict[str, Any] = {m: {"seconds": 0.0, "tokens": 0, "runs": [], "events": []} for m in modes}
    step = 0
    for _ in range(p["reps"]):
        for prompt in ids:
            order = modes[step % len(modes) :] + modes[: step % len(modes)]
            step += 1
            for mode in order:
                events.clear()
                stamps = []
                for _tok in run(mode, prompt, p["max_tokens"]):
                    stamps.append(time.perf_counter())
                gaps = [b - a for a, b in itertools.pairwise(stamps)]
                out[mode]["seconds"] += stamps[-1] - stamps[0]
                out[mode]["tokens"] += len(stamps) - 1
                out[mode]["runs"].append(gaps)
                out[mode]["events"].append(list(events))
    for m in modes:
        out[m]["tok_s"] = out[m]["tokens"] / out[m]["seconds"]
    emit({"modes": out})


if __name__ == "__main__":
    main()
