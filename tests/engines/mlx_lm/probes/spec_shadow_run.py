"""Probe: adaptive speculative decoding on real models, with the controller's catch-up evidence recorded.

Payload: {"target": folder, "drafters": {name: folder}, "tokens": int, "prompt": [ids] (optional)}. Result:
{"serial": {"0.0": tokens of ``generate_step``, greedy}, "runs": {name: {T: {"tokens", "n", "shadow": the values
``record_shadow`` got, in order, "cycles" (drafted, counted by ``SpeculativeStats``), "first_cycle_after": the serial
tokens emitted before the first drafted cycle (None when none was drafted)}}}} for T = 0 and 0.7 (seed 0). Without
``SpeculativeController`` (stock) only "serial" is filled.
"""

from __future__ import annotations

import importlib
from typing import Any

import mlx.core as mx
from probe_io import emit, read_payload

PROMPT = [5, 17, 33, 2, 91, 64, 12, 200, 7, 45, 150, 99]


def main() -> None:
    p = read_payload()
    from mlx_lm import load
    from mlx_lm.sample_utils import make_sampler

    gen = importlib.import_module("mlx_lm.generate")
    model = load(p["target"])[0]
    prompt = mx.array(p.get("prompt") or PROMPT)
    n = int(p["tokens"])
    out: dict[str, Any] = {
        "serial": {"0.0": [int(t) for t, _ in gen.generate_step(prompt, model, max_tokens=n)]},
        "runs": {},
    }
    base = getattr(gen, "SpeculativeController", None)
    if base is None or not hasattr(base, "record_shadow"):
        out["runs"] = dict.fromkeys(p["drafters"], "no record_shadow")
        emit(out)
        return
    seen: list[float] = []
    serial: list[int] = [0]
    first_cycle: list[int | None] = [None]

    class Recording(base):  # type: ignore[misc, valid-type]
        def record_shadow(self, values: list[float]) -> None:
            seen.extend(values)
            super().record_shadow(values)

        def serial_tokens(self, remaining: int | None = None) -> int:
            n = int(super().serial_tokens(remaining))
            serial[0] += n
            return n

        def record_cycle(
            self, k: int, accepted: int, seconds: float, draft_seconds: float | None = None, **kw: Any
        ) -> None:
            if first_cycle[0] is None:
                first_cycle[0] = serial[0]
            super().record_cycle(k, accepted, seconds, draft_seconds, **kw)

    for name, folder in p["drafters"].items():
        draft = load(folder)[0]
        out["runs"][name] = {}
        for temp in (0.0, 0.7):
            seen.clear()
            serial[0], first_cycle[0] = 0, None
            stats = gen.SpeculativeStats()
            mx.random.seed(0)
            tokens = [
                int(t)
                for t, _, _ in gen.speculative_generate_step(
                    prompt,
                    model,
                    draft,
                    num_draft_tokens=3,
                    max_tokens=n,
                    sampler=make_sampler(temp) if temp > 0 else None,
                    adaptive_draft=Recording(3),
                    spec_stats=stats,
                )
            ]
            out["runs"][name][str(temp)] = {
                "tokens": tokens,
                "n": len(tokens),
                "shadow": list(seen),
                "cycles": stats.cycles,
                "first_cycle_after": first_cycle[0],
            }
    emit(out)


if __name__ == "__main__":
    main()
