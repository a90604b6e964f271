"""mlx-lm adapter: runs for real on this machine (mlx[cpu]); tasks go to workers/mlx_lm_worker.py in each arm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlay.engines import WORKERS, Models, register
from overlay.envs import Arm
from overlay.errors import UsageError
from overlay.progress import Reporter

DEFAULT_TARGET = "llama-target"
DEFAULT_DRAFT = "llama-draft"


class MlxLmAdapter:
    engine = "mlx-lm"
    worker = WORKERS / "mlx_lm_worker.py"

    def unavailable(self, arm: Arm) -> str | None:
        proc = arm.run(["-c", "import mlx.core as mx; mx.array([1]) + 1"], timeout=120)
        if proc.returncode != 0:
            return f"mlx does not import in the arm: {proc.stderr.strip()[-300:]}"
        return None

    def tasks(self) -> tuple[str, ...]:
        return ("greedy", "logits", "spec", "speed", "cold")

    def models(self, *, root: Path, arm: Arm, model: Path | None, draft: Path | None, reporter: Reporter,
               target_kind: str | None = None, draft_kind: str | None = None) -> Models:
        from overlay import tinymodels

        if model is not None:
            if not (model / "config.json").is_file():
                raise UsageError(f"--model {model} is not a model folder (no config.json)")
            return Models(target=model, draft=draft)
        tk = target_kind or DEFAULT_TARGET
        dk = draft_kind or DEFAULT_DRAFT
        reporter.step("model", f"bundled tiny models: target {tk}, draft {dk}")
        target = tinymodels.build(tk, root=root, python=arm.python)
        real_draft = draft or tinymodels.build(dk, root=root, python=arm.python)
        return Models(target=target, target_kind=tk, draft=real_draft, draft_kind=None if draft else dk)

    def run(self, arm: Arm, request: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        result: dict[str, Any] = arm.run_json(self.worker, request, timeout=timeout or 1800)
        return result

    def fallback(self, *, root: Path, reporter: Reporter) -> dict[str, Any]:
        raise UsageError("mlx-lm has no fallback: it runs here")


register("mlx-lm")(MlxLmAdapter)
