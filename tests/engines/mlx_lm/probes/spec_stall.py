"""Probe: adaptive speculative decoding with one verify cycle stalled, as other load stalls a machine (patched arms).

Payload: {"target": folder, "draft": folder, "prompts": [text, ...], "max_tokens": int, "k": int,
"stall_cycle": int (the verify cycle, counted from 0 in each generation, that is stalled; -1: none),
"stall_seconds": float}. The stall is a sleep in the target's forward of that cycle (its verify: a call of 2 to k + 2
tokens; the prompts are longer than that), so the cycle's wall time grows as under a burst of other load and nothing else
changes. Greedy; ``speculative_generate_step(adaptive_draft=controller)`` with the arm's SpeculativeController.

Result: {"runs": [{"tokens": [...], "serial": tokens from serial steps, "cycles": verify cycles, "stalls":
controller.stalls (None where the arm's controller has none), "seconds": the generation's wall time}], "serial_tokens":
[...] (``generate_step``'s tokens for each prompt, the reference)}.
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
    model, tokenizer = load(p["target"])
    draft = load(p["draft"])[0]
    state = {"verifies": -1}
    cls = type(model)
    forward = cls.__call__
    widest = p["k"] + 2  # a verify's tokens: k drafts and the last token, with at most one replayed in front

    def stalled_call(self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            self is model and 1 < inputs.shape[-1] <= widest
        ):  # the prompts are longer: their prefill is not counted
            state["verifies"] += 1
            if state["verifies"] == p["stall_cycle"]:
                time.sleep(p["stall_seconds"])
        return forward(self, inputs, *args, **kwargs)

    out: dict[str, Any] = {"runs": [], "serial_tokens": []}
    for text in p["prompts"]:
        x = mx.array(tokenizer.encode(text))
        out["serial_tokens"].append(
            [int(t) for t, _ in gen.generate_step(x, model, max_tokens=p["max_tokens"])]
        )
        ctrl = gen.SpeculativeController(p["k"])
        stats = gen.SpeculativeStats()
        state["verifies"] = -1
        cls.__call__ = stalled_call
        tic = time.perf_counter()
        try:
            tokens = [
                int(t)
                for t, _, _ in gen.speculative_generate_step(
                    x,
                    model,
                    draft,
                    num_draft_tokens=p["k"],
                    max_tokens=p["max_tokens"],
                    adaptive_draft=ctrl,
                    spec_stats=stats,
                )
            ]
        finally:
            cls.__call__ = forward
        out["runs"].append(
            {
                "tokens": tokens,
                "serial": int(stats.serial_tokens),
                "cycles": int(stats.cycles),
                "stalls": getattr(ctrl, "stalls", None),
                "seconds": time.perf_counter() - tic,
            }
        )
    emit(out)


if __name__ == "__main__":
    main()
