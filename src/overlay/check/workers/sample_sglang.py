"""Sampled generation in an SGLang arm (CPU engine path) for the check's distribution test (stdin/stdout JSON; not
imported by overlay).

Request: {"model", "prompts": [[ids]], "temperature", "seeds": [int], "positions": P, "options"?}. Result:
{"tokens": [prompt][run] -> the first P sampled tokens, "seeded": false, "seconds": float}. One engine (the CPU
harness's settings, support/testbackends/sglang/run_engine.py, on the arm's PYTHONPATH; engine ``random_seed`` the
first seed) serves every (prompt, seed) run as one request of one batch: each run is an independent draw from the
engine's sampler (torch.multinomial on the CPU's global generator), which is what the chi-square test needs.

Not seeded per run: SGLang's per-request ``sampling_seed`` acts only with ``enable_deterministic_inference``, which
0.5.23 refuses with the torch_native attention backend of the CPU path ("only ascend, fa3, fa4, flashinfer,
intel_xpu, triton"), so runs are not comparable seed for seed across arms. CLI-style options are refused: the CPU
engine takes none of the series' flags as options (they are environment variables).
"""

import json
import sys
import time
from typing import Any


def main() -> None:
    req = json.loads(sys.stdin.read())
    if req.get("options"):
        raise SystemExit(
            f"sample_sglang: CLI options {sorted(req['options'])} are not applied by the CPU engine"
        )
    import run_engine  # test infrastructure, on the arm's PYTHONPATH
    import sglang

    n = int(req["positions"])
    runs = [(p, s) for p in range(len(req["prompts"])) for s in req["seeds"]]
    engine_args = {"max_running_requests": int(req.get("batch", 64)), "max_total_tokens": 16384}
    started = time.monotonic()
    payload = {"model": req["model"], "seed": int(req["seeds"][0])}
    engine = sglang.Engine(**run_engine._engine_kwargs(payload, {"engine_args": engine_args}))
    try:
        results = engine.generate(
            input_ids=[req["prompts"][p] for p, _ in runs],
            sampling_params=[
                {"temperature": float(req["temperature"]), "max_new_tokens": n, "ignore_eos": True}
                for _ in runs
            ],
        )
    finally:
        engine.shutdown()
    out: list[list[Any]] = [[] for _ in req["prompts"]]
    for (p, _seed), r in zip(runs, results):
        out[p].append([int(t) for t in r["output_ids"]][:n])
    print(json.dumps({"tokens": out, "seeded": False, "seconds": time.monotonic() - started}))


if __name__ == "__main__":
    main()
