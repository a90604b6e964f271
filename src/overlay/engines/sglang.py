"""SGLang adapter (CPU engine path; see docs/engines/sglang.md). Filled in with the CPU harness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlay.engines import Models, register
from overlay.engines.exllamav3 import run_patch_tests
from overlay.envs import Arm
from overlay.errors import UsageError
from overlay.progress import Reporter


class SglangAdapter:
    engine = "sglang"

    def unavailable(self, arm: Arm) -> str | None:
        return "the SGLang CPU engine adapter is not wired yet"

    def tasks(self) -> tuple[str, ...]:
        return ()

    def models(self, *, root: Path, arm: Arm, model: Path | None, draft: Path | None, reporter: Reporter,
               target_kind: str | None = None, draft_kind: str | None = None) -> Models:
        raise UsageError("not wired yet")

    def run(self, arm: Arm, request: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        raise UsageError("not wired yet")

    def fallback(self, *, root: Path, reporter: Reporter) -> dict[str, Any]:
        return run_patch_tests(root, "sglang", reporter)


register("sglang")(SglangAdapter)
