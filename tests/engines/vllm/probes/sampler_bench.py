"""One arm's side of scripts/bench_vllm_sampler.py: a vLLM engine kept alive, timed on request (run with a vLLM arm's
interpreter; never imports overlay).

    ARM/bin/python tests/engines/vllm/probes/sampler_bench.py MODEL

Starts the check's engine (workers/vllm_worker.py ``_llm``: in this process, float32, eager), prints ``{"ready": ...}``,
then answers one JSON command per stdin line with one JSON line on stdout (after MARK: other output may reach stdout):

- ``{"task": "engine", "batch": B, "tokens": N, "seed": S}``: B seeded sampled requests (SAMPLED: temperature 0.7,
  top-k 20, top-p 0.8) of N tokens each after an 8-token prompt, decoded together by ``LLMEngine.step`` calls; the
  seconds from the end of the first step (the prefill, which samples the first token) to the end of the last, the
  number of decode steps, and the tokens.
- ``{"task": "function", "batch": B, "vocab": V, "reps": R}``: ``apply_top_k_top_p_pytorch`` on B rows of V seeded
  random logits at the same top-k / top-p, R calls; the median seconds of one call.
- ``{"task": "quit"}``.

vLLM's logs go to stderr.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

WORKERS = Path(__file__).resolve().parents[4] / "src" / "overlay" / "engines" / "workers"
SAMPLED = {"temperature": 0.7, "top_k": 20, "top_p": 0.8}
MARK = "@@sampler-bench "


def engine_run(llm: Any, batch: int, tokens: int, seed: int) -> dict[str, Any]:
    from vllm import SamplingParams

    engine = llm.llm_engine
    for i in range(batch):
        params = SamplingParams(**SAMPLED, seed=seed + i, max_tokens=tokens, ignore_eos=True)
        prompt = [0, *(1 + (j * 37 + i * 101 + seed) % 500 for j in range(7))]
        engine.add_request(f"bench-{seed}-{i}", {"prompt_token_ids": prompt}, params)
    stamps: list[float] = []
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out[o.request_id] = list(o.outputs[0].token_ids)
        stamps.append(time.perf_counter())
    decode = (
        stamps[-1] - stamps[0]
    )  # after the prefill step (which samples the first token) to the last token
    return {"seconds": decode, "decode_steps": len(stamps) - 1, "tokens": [out[k] for k in sorted(out)]}


def function_run(batch: int, vocab: int, reps: int) -> dict[str, Any]:
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(batch, vocab, generator=g) * 3
    k = torch.full((batch,), SAMPLED["top_k"])
    p = torch.full((batch,), SAMPLED["top_p"])
    times = []
    for _ in range(reps):
        x = logits.clone()
        t = time.perf_counter()
        apply_top_k_top_p_pytorch(x, k, p, allow_cpu_sync=True)
        times.append(time.perf_counter() - t)
    return {"seconds": statistics.median(times)}


def say(doc: dict[str, Any]) -> None:
    """One answer line, marked (vLLM and its libraries print to stdout too)."""
    print(MARK + json.dumps(doc), flush=True)


def main() -> int:
    sys.path.insert(0, str(WORKERS))
    import vllm_worker

    llm = vllm_worker._llm(sys.argv[1], engine_args={"max_num_seqs": 8})
    import torch

    say({"ready": True, "threads": torch.get_num_threads()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["task"] == "quit":
            break
        if cmd["task"] == "engine":
            res = engine_run(llm, cmd["batch"], cmd["tokens"], cmd["seed"])
        else:
            res = function_run(cmd["batch"], cmd["vocab"], cmd["reps"])
        say(res)
    vllm_worker._shutdown(llm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
