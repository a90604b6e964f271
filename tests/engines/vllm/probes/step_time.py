"""Where one vLLM engine step's host time goes on the CPU build, without the census (its modes slow every op): run with
a vLLM arm's interpreter (docs/engines/vllm.md, "Mechanism census").

    ARM/bin/python tests/engines/vllm/probes/step_time.py SCENARIO MODEL [STEPS]

The engine and the workload are the census's (workers/vllm_census.py: decode-step, prefill-chunk or
spec-verify-step); each phase is timed by wrapping vLLM's own methods on the live objects (nothing of vLLM is
changed), inclusive of what it calls. Prints one JSON document: per phase the median milliseconds over the steps of
the scenario's kind (after the warm-up) and the share of the whole step (phases nest: prepare_inputs and forward are
inside execute_model; bookkeeping, the sampler and the proposer inside sample_tokens). vLLM's logs go to stderr.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

WORKERS = Path(__file__).resolve().parents[4] / "src" / "overlay" / "engines" / "workers"
PHASES = (
    ("scheduler", "schedule", "schedule"),
    ("runner", "execute_model", "execute_model"),
    ("runner", "_prepare_inputs", "  prepare_inputs"),
    ("runner", "_model_forward", "  forward"),
    ("runner", "sample_tokens", "sample_tokens"),
    ("runner", "_sample", "  sampler (+ rejection sampler)"),
    ("runner", "_bookkeeping_sync", "  bookkeeping (host read of the sampled ids)"),
    ("runner", "propose_draft_token_ids", "  n-gram proposer"),
    ("scheduler", "update_from_output", "update_from_output"),
    ("core", "post_step", "post_step (drafts to the scheduler)"),
    ("output", "process_outputs", "output processing (detokenize)"),
)


def main() -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    scenario, model = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    sys.path.insert(0, str(WORKERS))
    import vllm_census
    from vllm import SamplingParams

    llm = vllm_census._engine(model, scenario)
    engine = llm.llm_engine
    core, runner = vllm_census._runner(llm)
    objects = {"scheduler": core.scheduler, "runner": runner, "core": core, "output": engine.output_processor}
    current: dict[str, float] = {}
    seen: dict[str, Any] = {}

    def timed(fn: Any, label: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                current[label] = current.get(label, 0.0) + time.perf_counter() - t0

        return run

    for where, name, label in PHASES:
        obj = objects[where]
        if hasattr(obj, name):
            setattr(obj, name, timed(getattr(obj, name), label))
    sched = core.scheduler
    schedule = sched.schedule

    def classified(*args: Any, **kwargs: Any) -> Any:
        prefilling = {rid: r.num_computed_tokens < r.num_prompt_tokens for rid, r in sched.requests.items()}
        result = schedule(*args, **kwargs)
        seen["kind"] = vllm_census._kind(result, prefilling)
        return result

    sched.schedule = classified
    prompts, max_tokens = vllm_census._workload(scenario, steps, model)
    params = SamplingParams(temperature=0.0, max_tokens=max(max_tokens, 4 * steps + 16), ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"t-{i}", {"prompt_token_ids": p}, params)
    rows: list[dict[str, float]] = []
    while engine.has_unfinished_requests() and len(rows) < vllm_census.WARMUP + steps:
        current.clear()
        t0 = time.perf_counter()
        engine.step()
        current["step"] = time.perf_counter() - t0
        if seen.pop("kind", None) == scenario:
            rows.append(dict(current))
    rows = rows[vllm_census.WARMUP :]
    import vllm_worker

    vllm_worker._shutdown(llm)
    labels = ["step", *(label for _, _, label in PHASES)]
    total = statistics.median(r["step"] for r in rows) if rows else 0.0
    doc = {
        "scenario": scenario,
        "steps": len(rows),
        "ms": {k: round(1e3 * statistics.median(r.get(k, 0.0) for r in rows), 3) for k in labels}
        if rows
        else {},
        "share": {k: round(statistics.median(r.get(k, 0.0) for r in rows) / total, 3) for k in labels}
        if rows and total
        else {},
    }
    out.write(json.dumps(doc) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
