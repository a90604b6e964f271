"""Probe: model_init.init() with --warmup_draft: what runs between the loads and the return.

Model.load is a no-op and Model.warmup a recorder (both need the CUDA extension); the tokenizer is a stand-in with a
vocabulary size. The Generator and Job the drafter warmup uses are replaced by recorders: the generator records
its construction (models, caches, arguments), the jobs it is given (prompt length, token budget, sampler) and how
many iterations ran; iterate() emits the job's tokens one speculative round (K + 1 tokens) at a time. Events are
recorded in order, so the test can check the warmup runs after the target warmup and before init() returns.

payload: {"argv": [...], "mtp": bool} or {"cases": [...]}
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _common import run_cases, tiny_dflash2, tiny_llama


def case(payload: dict[str, Any]) -> dict[str, Any]:
    import argparse

    import exllamav3.generator as gen_pkg
    from exllamav3 import Model, Tokenizer, model_init

    events: list[Any] = []
    Model.load = lambda self, *a, **k: events.append(["load", type(self).__name__])
    Model.warmup = lambda self, *a, **k: events.append(["model.warmup", type(self).__name__]) or []  # type: ignore[func-returns-value]
    Tokenizer.from_config = staticmethod(lambda config: SimpleNamespace(actual_vocab_size=500))

    class FakeJob:
        def __init__(
            self, input_ids: Any, max_new_tokens: Any, sampler: Any, stop_conditions: Any, identifier: Any
        ) -> None:
            self.prompt = int(input_ids.shape[-1])
            self.max_new_tokens = max_new_tokens
            self.left = max_new_tokens
            self.sampler = type(sampler).__name__
            self.identifier = identifier
            self.ids_in_vocab = bool((input_ids >= 0).all() and (input_ids < 500).all())

    class FakeGenerator:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs
            self.jobs: list[Any] = []
            self.num_draft_tokens = kwargs.get("num_draft_tokens") or kwargs["draft_model"].caps.get(
                "default_draft_size", 4
            )
            self.iterations = 0
            events.append(
                [
                    "generator",
                    {
                        "model": type(kwargs["model"]).__name__,
                        "draft_model": type(kwargs["draft_model"]).__name__,
                        "cache_is_target": kwargs["cache"] is not None
                        and kwargs["cache"].model is kwargs["model"],
                        "draft_cache_is_draft": kwargs["draft_cache"] is not None
                        and kwargs["draft_cache"].model is kwargs["draft_model"],
                        "recurrent_cache_size": kwargs.get("recurrent_cache_size"),
                    },
                ]
            )

        def enqueue(self, job: Any) -> None:
            self.jobs.append(job)
            events.append(
                [
                    "enqueue",
                    {
                        "prompt": job.prompt,
                        "max_new_tokens": job.max_new_tokens,
                        "sampler": job.sampler,
                        "in_vocab": job.ids_in_vocab,
                    },
                ]
            )

        def num_remaining_jobs(self) -> Any:
            return sum(1 for j in self.jobs if j.left > 0)

        def iterate(self) -> Any:
            self.iterations += 1
            for j in self.jobs:
                j.left -= min(j.left, self.num_draft_tokens + 1)
            return []

        def clear_queue(self) -> None:
            events.append(["clear_queue"])

        def close(self) -> None:
            events.append(["close", self.iterations])

    gen_pkg.Generator = FakeGenerator
    gen_pkg.Job = FakeJob
    with tempfile.TemporaryDirectory() as tmp:
        target = tiny_llama(Path(tmp) / "t")
        draft = tiny_dflash2(Path(tmp) / "d", layer_types=["sliding_attention"] * 3)
        parser = argparse.ArgumentParser(exit_on_error=False)
        model_init.add_args(parser, add_draft_model_args=True, cache=True)
        argv = ["-m", str(target), "-cs", "1024", *payload.get("argv", [])]
        if payload.get("draft", True):
            argv += ["-dm", str(draft)]
        try:
            args = parser.parse_args(argv)
        except (argparse.ArgumentError, SystemExit) as e:
            return {"error": f"argparse: {e}"}
        try:
            result = model_init.init(
                args, load_tokenizer=payload.get("tokenizer", True), quiet=True, progress=False
            )
        except ValueError as e:
            return {"error": str(e), "events": events}
        events.append(["returned", len(result)])
    return {"events": events}


if __name__ == "__main__":
    run_cases(case)
