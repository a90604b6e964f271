"""Probe: the work per token of the speculative generator's serial path against ``generate_step``, counted.

Payload: {"hooks": folder of mlx_census_hooks.py, "target": folder, "draft": folder, "prompt": [ids] or "prompt_text" (optional),
"max_tokens": int, "k": int, "modes": ["serial" | "adaptive" | "never", ...], "count": "evals" | "calls"}.
``serial``: ``generate_step``; ``adaptive``: ``speculative_generate_step(adaptive_draft=True)``; ``never``: the same
with a controller that never drafts (one serial run of every token, no catch-up). Greedy; each mode runs once to
warm up (compile traces), then once counted.

- ``count: "evals"``: the mlx census's hooks (mlx_census_hooks.Census, installed before mlx_lm is imported) log every
  evaluation (mx.eval, mx.async_eval, and the implicit ones: item, tolist, ...) with the primitives it materialises
  and the model whose forward came last (``target`` / ``draft``). Per token (the events between one yield and the
  next): evaluations, host syncs, primitives, and ``pipelined``: the next target step was queued (an async_eval
  after this token's own) before this token was read back, as generate_step does.
- ``count: "calls"``: no hooks; ``sys.setprofile`` counts the Python function calls (``call``) and the calls of
  C functions made from Python (``c_call``: mlx ops, list appends, time.perf_counter ...) between yields, by name.

Result: {"modes": {mode: {"tokens": [ids], "per_token": [{...} per yield], "tail": what ran after the last yield
(the generator's return: events or calls), "primitives": {phase: {name: count}} over the counted run (evals),
"cycles": drafted cycles (speculative modes)}}}; the first yield holds the
prefill.
"""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from typing import Any

from probe_io import emit, read_payload

PROMPT = [5, 17, 33, 2, 91, 64, 12, 200, 7, 45, 150, 99]


def main() -> None:
    p = read_payload()
    counting = p.get("count", "evals")
    import mlx.core as mx

    log: list[list[Any]] = []
    census: Any = None
    if counting == "evals":
        sys.path.insert(0, p["hooks"])
        from mlx_census_hooks import Census

        class Logged(Census):
            def materialise(self, kind: str, arrays: list[Any], depth: int = 2) -> str | None:
                before = sum(self.ops.values())
                site = super().materialise(kind, arrays, depth + 1)
                if site is not None:
                    log.append([kind, self.phase, sum(self.ops.values()) - before, site])
                return site

        census = Logged(mx)
        census.install()
    from mlx_lm import load

    gen = importlib.import_module("mlx_lm.generate")
    model, tokenizer = load(p["target"])
    draft = load(p["draft"])[0]
    if census is not None:
        census.tag_model(model, "target")
        census.tag_model(draft, "draft")
    prompt = mx.array(
        tokenizer.encode(p["prompt_text"]) if p.get("prompt_text") else p.get("prompt") or PROMPT
    )
    n, k = int(p["max_tokens"]), int(p["k"])
    base = gen.SpeculativeController

    class Never(base):  # type: ignore[misc, valid-type]
        def serial_tokens(self, remaining: Any = None) -> int:
            return int(remaining or 1 << 30)

    def run(mode: str, stats: Any) -> Any:
        if mode == "serial":
            return ((t, False) for t, _ in gen.generate_step(prompt, model, max_tokens=n))
        ctrl = base(k) if mode == "adaptive" else Never(k)
        return (
            (t, d)
            for t, _, d in gen.speculative_generate_step(
                prompt, model, draft, num_draft_tokens=k, max_tokens=n, adaptive_draft=ctrl, spec_stats=stats
            )
        )

    calls: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[f"py {frame.f_code.co_name}"] += 1
        elif event == "c_call":
            calls[f"c {getattr(arg, '__qualname__', None) or getattr(arg, '__name__', '?')}"] += 1

    out: dict[str, Any] = {}
    for mode in p["modes"]:
        for _ in run(mode, None):  # warm-up
            pass
        stats = gen.SpeculativeStats()
        tail: Any = None
        tokens: list[int] = []
        per_token: list[dict[str, Any]] = []
        log.clear()
        calls.clear()
        if census is not None:
            census.reset()
        it = iter(run(mode, stats))
        while True:
            if counting == "calls":
                sys.setprofile(profile)
            try:
                tok, drafted = next(it)
            except StopIteration:
                tail = list(log) if counting == "evals" else dict(calls)
                break
            finally:
                sys.setprofile(None)
            tokens.append(int(tok))
            if counting == "calls":
                per_token.append({"calls": dict(calls), "drafted": bool(drafted)})
                calls.clear()
                continue
            events, log[:] = list(log), []
            reads = [i for i, e in enumerate(events) if e[0] != "async_eval" and e[1] == "target"]
            last_read = reads[-1] if reads else len(events)
            target_async = [i for i, e in enumerate(events) if e[0] == "async_eval" and e[1] == "target"]
            per_token.append(
                {
                    "drafted": bool(drafted),
                    "events": events,
                    "evals": len(events),
                    "syncs": sum(e[0] != "async_eval" for e in events),
                    "ops": {ph: sum(e[2] for e in events if e[1] == ph) for ph in ("target", "draft")},
                    "draft_evals": sum(e[1] == "draft" for e in events),
                    # generate_step's order: the next step's async_eval, then this token's read-back
                    "pipelined": any(i < last_read for i in target_async),
                }
            )
        out[mode] = {
            "tokens": tokens,
            "per_token": per_token,
            "tail": tail,
            "primitives": {ph: dict(c) for ph, c in census.prims.items()} if census is not None else None,
            "cycles": stats.cycles if mode != "serial" else 0,
        }
    emit({"modes": out})


if __name__ == "__main__":
    main()
