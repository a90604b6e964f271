"""One arm's side of scripts/bench_vllm_sampler.py: a vLLM engine kept alive, timed on request (run with a vLLM arm's
interpreter; never imports overlay).

    ARM/bin/python tests/engines/vllm/probes/sampler_bench.py MODEL [spec]

Starts the check's engine (workers/vllm_worker.py ``_llm``: in this process, float32, eager; with ``spec``, n-gram
speculation as the census's spec-verify-step has it: k=3, lookup 2-5), prints ``{"ready": ...}``,
then answers one JSON command per stdin line with one JSON line on stdout (after MARK: other output may reach stdout):

- ``{"task": "engine", "mode": M, "batch": B, "tokens": N, "seed": S}``: B seeded sampled requests (SAMPLED[M]:
  "top-k-top-p" temperature 0.7, top-k 20, top-p 0.8; "top-p" temperature 0.7, top-p 0.9; "penalties" temperature
  0.7, repetition 1.05, presence 0.3, frequency 0.2; "spec" as "top-k-top-p") of N tokens each after an 8-token
  prompt ("spec": a 6-token phrase four times, for the n-gram proposer to draft from), decoded together by
  ``LLMEngine.step`` calls; the seconds from the end of the first step (the prefill, which samples the first token) to
  the end of the last, the number of decode steps, the tokens decoded in them, and the tokens.
- ``{"task": "function", "mode": M, "batch": B, "vocab": V, "scale": X, "reps": R}``: ``apply_top_k_top_p_pytorch`` on
  B rows of V seeded normal logits times X at SAMPLED[M]'s top-k / top-p, R calls; the median seconds of one call and
  the tokens kept per row (the nucleus, for top-p alone: the larger X, the fewer); for "penalties",
  ``apply_all_penalties`` on B rows with a 512-token prompt and a 256-token output each, and the logits it changed per
  row; for "spec", ``rejection_sample`` (after ``apply_sampling_constraints``) on B requests of 3 drafts, each draft
  its position's most likely token, and the drafts accepted per request.
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
SAMPLED: dict[str, dict[str, Any]] = {
    "top-k-top-p": {"temperature": 0.7, "top_k": 20, "top_p": 0.8},
    "top-p": {"temperature": 0.7, "top_p": 0.9},
    "penalties": {
        "temperature": 0.7,
        "repetition_penalty": 1.05,
        "presence_penalty": 0.3,
        "frequency_penalty": 0.2,
    },
    "spec": {"temperature": 0.7, "top_k": 20, "top_p": 0.8},
}
SPEC_K = 3  # drafts per request in "spec"
PENALTY_PROMPT, PENALTY_OUTPUT = 512, 256  # the function's prompt and output tokens per row (penalties)
MARK = "@@sampler-bench "


def engine_run(llm: Any, mode: str, batch: int, tokens: int, seed: int) -> dict[str, Any]:
    from vllm import SamplingParams

    engine = llm.llm_engine
    for i in range(batch):
        params = SamplingParams(**SAMPLED[mode], seed=seed + i, max_tokens=tokens, ignore_eos=True)
        phrase = [1 + (j * 37 + i * 101 + seed) % 500 for j in range(6 if mode == "spec" else 7)]
        prompt = [0, *(phrase * 4 if mode == "spec" else phrase)]
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
    outputs = [out[k] for k in sorted(out)]
    decoded = sum(len(t) - 1 for t in outputs)  # the first token of each comes from the prefill step
    return {"seconds": decode, "decode_steps": len(stamps) - 1, "decoded": decoded, "tokens": outputs}


def function_run(mode: str, batch: int, vocab: int, scale: float, reps: int) -> dict[str, Any]:
    import torch

    if mode == "penalties":
        return penalties_run(batch, vocab, scale, reps)
    if mode == "spec":
        return rejection_run(batch, vocab, scale, reps)
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(batch, vocab, generator=g) * scale
    top_k = SAMPLED[mode].get("top_k")
    k = None if top_k is None else torch.full((batch,), top_k)
    p = torch.full((batch,), SAMPLED[mode]["top_p"])
    times = []
    for _ in range(reps):
        x = logits.clone()
        t = time.perf_counter()
        out = apply_top_k_top_p_pytorch(x, k, p, allow_cpu_sync=True)
        times.append(time.perf_counter() - t)
    kept = (out > -float("inf")).sum(dim=-1).tolist()
    return {"seconds": statistics.median(times), "kept": kept}


def penalties_run(batch: int, vocab: int, scale: float, reps: int) -> dict[str, Any]:
    """``apply_all_penalties`` on B rows: a prompt of PENALTY_PROMPT and an output of PENALTY_OUTPUT seeded tokens per
    row, SAMPLED["penalties"]'s penalties; "kept" is the number of logits the penalties changed per row."""
    import torch
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(batch, vocab, generator=g) * scale
    prompt = torch.randint(0, vocab, (batch, PENALTY_PROMPT), generator=g)
    output = torch.randint(0, vocab, (batch, PENALTY_OUTPUT), generator=g).tolist()
    params = SAMPLED["penalties"]
    presence, frequency, repetition = (
        torch.full((batch,), float(params[k]))
        for k in ("presence_penalty", "frequency_penalty", "repetition_penalty")
    )
    times = []
    for _ in range(reps):
        x = logits.clone()
        t = time.perf_counter()
        out = apply_all_penalties(x, prompt, presence, frequency, repetition, output)
        times.append(time.perf_counter() - t)
    return {"seconds": statistics.median(times), "kept": (out != logits).sum(dim=-1).tolist()}


def rejection_run(batch: int, vocab: int, scale: float, reps: int) -> dict[str, Any]:
    """``rejection_sample`` for B seeded requests of SPEC_K drafts, each its position's most likely token, on logits
    already through ``apply_sampling_constraints`` at SAMPLED["spec"]; "kept" is the drafts accepted per request."""
    import types

    import torch
    from vllm.v1.sample import rejection_sampler as rs

    g = torch.Generator().manual_seed(vocab)
    n = batch * SPEC_K
    params = SAMPLED["spec"]
    md = types.SimpleNamespace(
        all_greedy=False,
        all_random=True,
        temperature=torch.full((batch,), params["temperature"]),
        generators={i: torch.Generator().manual_seed(i) for i in range(batch)},
        top_k=torch.full((batch,), params["top_k"], dtype=torch.int32),
        top_p=torch.full((batch,), params["top_p"]),
    )
    cu = (torch.arange(1, batch + 1) * SPEC_K).to(torch.int32)
    logits = rs.apply_sampling_constraints(torch.randn(n, vocab, generator=g) * scale, cu, md)
    draft = logits.argmax(dim=-1).to(torch.int32)
    bonus = torch.zeros((batch, 1), dtype=torch.int32)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = rs.rejection_sample(draft, [SPEC_K] * batch, SPEC_K, cu, None, logits, bonus, md)
        times.append(time.perf_counter() - t)
    accepted = (out[:, :SPEC_K] == draft.view(batch, SPEC_K)).int().cumprod(1).sum(1)
    return {"seconds": statistics.median(times), "kept": accepted.tolist()}


def say(doc: dict[str, Any]) -> None:
    """One answer line, marked (vLLM and its libraries print to stdout too)."""
    print(MARK + json.dumps(doc), flush=True)


def main() -> int:
    sys.path.insert(0, str(WORKERS))
    import vllm_worker

    engine_args: dict[str, Any] = {"max_num_seqs": 8}
    if sys.argv[2:] == ["spec"]:
        engine_args["speculative_config"] = vllm_worker.speculative_config(vllm_worker.NGRAM, SPEC_K)
    llm = vllm_worker._llm(sys.argv[1], engine_args=engine_args)
    import torch

    say({"ready": True, "threads": torch.get_num_threads()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["task"] == "quit":
            break
        if cmd["task"] == "engine":
            res = engine_run(llm, cmd["mode"], cmd["batch"], cmd["tokens"], cmd["seed"])
        else:
            res = function_run(cmd["mode"], cmd["batch"], cmd["vocab"], cmd["scale"], cmd["reps"])
        say(res)
    vllm_worker._shutdown(llm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
