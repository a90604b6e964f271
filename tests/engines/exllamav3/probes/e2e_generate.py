"""Probe (GPU only, used by scripts/device/exllamav3_check.py): greedy generation end to end on a real EXL3 model.

Loads an EXL3 model (converted on the device machine from a tiny HF model), builds a Generator (plain decode, a draft
model, or n-gram drafting), generates greedily for each prompt and reports the token ids, the time to first token
(from process start, and the generator's own prefill time), the number of iterations and the wall time per
iteration. Flags come through "env" (the EXL3_OVL_* switches are read per call).

payload: {"model": DIR, "draft_model": DIR|null, "ngram": int, "num_draft_tokens": int|null, "prompts": [str],
"max_new_tokens": int, "cache_tokens": int, "env": {...}} or {"cases": [...]}; the model is loaded once per process.
"""

from __future__ import annotations

import time
from typing import Any

T_PROCESS = time.perf_counter()

from _common import run_cases

_LOADED: dict[tuple[str, str | None, int], Any] = {}


def _load(path: str, draft: str | None, cache_tokens: int) -> Any:
    key = (path, draft, cache_tokens)
    if key in _LOADED:
        return _LOADED[key]
    from exllamav3 import Cache, Config, Model, Tokenizer

    config = Config.from_directory(path)
    model = Model.from_config(config)
    cache = Cache(model, max_num_tokens=cache_tokens)
    draft_model = draft_cache = None
    if draft:
        draft_config = Config.from_directory(draft)
        draft_model = Model.from_config(draft_config)
        draft_cache = Cache(draft_model, max_num_tokens=cache_tokens)
        draft_model.load()
    model.load()
    tokenizer = Tokenizer.from_config(config)
    _LOADED[key] = (model, cache, tokenizer, draft_model, draft_cache)
    return _LOADED[key]


def case(payload: dict[str, Any]) -> dict[str, Any]:
    import torch
    from exllamav3 import Generator, Job
    from exllamav3.generator.sampler import ArgmaxSampler

    t_load = time.perf_counter()
    model, cache, tokenizer, draft_model, draft_cache = _load(
        payload["model"], payload.get("draft_model"), payload.get("cache_tokens", 4096)
    )
    load_s = time.perf_counter() - t_load
    generator = Generator(
        model=model,
        cache=cache,
        tokenizer=tokenizer,
        draft_model=draft_model,
        draft_cache=draft_cache,
        num_draft_tokens=payload.get("num_draft_tokens"),
        ngram_match_min=payload.get("ngram", 0),
        recurrent_cache_size=0,
    )
    out: dict[str, Any] = {
        "tokens": [],
        "ttft_process_s": None,
        "prefill_s": [],
        "iterations": 0,
        "iterate_s": 0.0,
        "accepted": 0,
        "rejected": 0,
        "load_s": round(load_s, 3),
    }
    for prompt in payload["prompts"]:
        ids = tokenizer.encode(prompt, add_bos=True)
        job = Job(
            input_ids=ids,
            max_new_tokens=payload.get("max_new_tokens", 64),
            sampler=ArgmaxSampler(),
            stop_conditions=[],
        )
        generator.enqueue(job)
        tokens: list[int] = []
        while generator.num_remaining_jobs():
            t0 = time.perf_counter()
            results = generator.iterate()
            out["iterate_s"] += time.perf_counter() - t0
            out["iterations"] += 1
            for r in results:
                if "token_ids" in r:
                    if out["ttft_process_s"] is None:
                        out["ttft_process_s"] = round(time.perf_counter() - T_PROCESS, 3)
                    tokens += r["token_ids"].view(-1).tolist()
                if r.get("eos"):
                    out["prefill_s"].append(round(r.get("time_prefill", 0.0), 4))
                    out["accepted"] += r.get("accepted_draft_tokens", 0)
                    out["rejected"] += r.get("rejected_draft_tokens", 0)
        out["tokens"].append(tokens)
    torch.cuda.synchronize()
    out["iterate_ms"] = round(1000 * out["iterate_s"] / max(out["iterations"], 1), 3)
    out["generated"] = sum(len(t) for t in out["tokens"])
    out["tok_s"] = round(out["generated"] / out["iterate_s"], 1) if out["iterate_s"] else None
    generator.close()
    return out


if __name__ == "__main__":
    run_cases(case)
