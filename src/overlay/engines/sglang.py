"""SGLang adapter: the CPU engine path (docs/engines/sglang.md): SGLANG_USE_CPU_ENGINE, torch CPU, torchvision kept
from import and a pure-torch stand-in for the sgl_kernel CPU ops (all test infrastructure, from the manifest's
[runtime]). Greedy identity, teacher-forced logits (capped positions), STANDALONE speculative acceptance (and, with
``--draft-kind deepseek_v3-nextn-random``, the "mtp" run: NEXTN on that checkpoint), speed and cold start run through
workers/sglang_worker.py in each arm."""

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
DEFAULT_DRAFT = "llama-draft"
# the worker's census task (workers/sglang_worker.py task_census, counted in the scheduler by sglang_census_hook.py)
CENSUS_SCENARIOS = (
    "decode-step",
    "decode-step-sampled",
    "decode-step-spec",
    "spec-verify-step",
    "draft-round",
    "draft-extend",
    "draft-extend-draft",
    "prefill-chunk",
)


class SglangAdapter:
    engine = "sglang"
    worker = WORKERS / "sglang_worker.py"
    max_positions = 4096  # full-vocabulary input logprobs go through the engine's API: slow on CPU

    def unavailable(self, arm: Arm) -> str | None:
        proc = arm.run(["-c", "import sglang.srt.server_args"], timeout=600)
        if proc.returncode != 0:
            return f"sglang does not import in the arm: {proc.stderr.strip()[-400:]}"
        return None

    def tasks(self) -> tuple[str, ...]:
        return ("greedy", "logits", "spec", "speed", "cold")

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
        tk, dk = target_kind or DEFAULT_TARGET, draft_kind or DEFAULT_DRAFT
        mtp = draft is None and tinymodels.is_nextn(dk)
        reporter.step(
            "model",
            f"bundled tiny models: target {tk}, "
            + (f"MTP run on {dk} (NEXTN, its own NextN layer drafts)" if mtp else f"draft {dk}")
            + " (trained ones with the stock mlx-lm arm)",
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
        return run_patch_tests(root, "sglang", reporter)

    def census_scenarios(self) -> tuple[str, ...]:
        return CENSUS_SCENARIOS
