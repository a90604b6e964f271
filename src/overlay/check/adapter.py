"""What `overlay check` needs from an engine: the :class:`EngineAdapter` Protocol and the checkpoints it runs on.

The adapters themselves live in :mod:`overlay.engines` (one module per engine, one explicit registry); the caller
looks one up and hands it to :func:`overlay.check.run.run_check`, so the check layer imports no engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from overlay.check.envs import Arm
from overlay.errors import UsageError
from overlay.progress import Reporter
from overlay.schemas.documents import WorkerRequest

TASKS = ("greedy", "logits", "spec", "speed", "cold")


@dataclass(frozen=True)
class Models:
    """The checkpoints a check runs on (HF-format folders)."""

    target: Path
    target_kind: str | None = None
    draft: Path | None = None  # the "real" drafter
    draft_kind: str | None = None
    extra: dict[str, Path] = field(default_factory=dict)


def given_models(model: Path | None, draft: Path | None) -> Models | None:
    """The user's ``--model``/``--draft-model`` (None when no ``--model`` was given); a folder without config.json is
    refused (exit 2)."""
    if model is None:
        return None
    if not (model / "config.json").is_file():
        raise UsageError(f"--model {model} is not a model folder (no config.json)")
    return Models(target=model, draft=draft)


class EngineAdapter(Protocol):
    engine: str

    def unavailable(self, arm: Arm) -> str | None:
        """Why the engine cannot run in ``arm`` on this machine (None when it can)."""

    def tasks(self) -> tuple[str, ...]:
        """Which of TASKS this adapter runs."""

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
        """The checkpoints to use: ``model``/``draft`` when given, else bundled tiny models."""

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        """Run one task request in a fresh process of ``arm``; return its JSON result."""

    def fallback(self, *, root: Path, reporter: Reporter) -> dict[str, Any]:
        """What `check` runs instead when the engine is unavailable here (e.g. the patch-level CPU tests)."""

    def census_scenarios(self) -> tuple[str, ...]:
        """The mechanism-census scenarios (overlay.core.mechanism.SCENARIOS) this adapter's ``census`` task runs on this
        machine; a declared mechanism in any other scenario is reported as not measured."""
