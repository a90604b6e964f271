"""Engines behind one Protocol, looked up in a registry: adding an engine is adding a module, not an `if`.

An adapter knows how to run `overlay check`'s tasks in an arm (a venv holding the stock or the patched wheel) on this
machine, which bundled models to use, and, where the engine cannot run here, what to do instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from overlay.envs import Arm
from overlay.errors import UsageError
from overlay.progress import Reporter

TASKS = ("greedy", "logits", "spec", "speed", "cold")


@dataclass(frozen=True)
class Models:
    """The checkpoints a check runs on (HF-format folders)."""

    target: Path
    target_kind: str | None = None
    draft: Path | None = None  # the "real" drafter
    draft_kind: str | None = None
    extra: dict[str, Path] = field(default_factory=dict)


class EngineAdapter(Protocol):
    engine: str

    def unavailable(self, arm: Arm) -> str | None:
        """Why the engine cannot run in ``arm`` on this machine (None when it can)."""

    def tasks(self) -> tuple[str, ...]:
        """Which of TASKS this adapter runs."""

    def models(self, *, root: Path, arm: Arm, model: Path | None, draft: Path | None, reporter: Reporter,
               target_kind: str | None = None, draft_kind: str | None = None) -> Models:
        """The checkpoints to use: ``model``/``draft`` when given, else bundled tiny models."""

    def run(self, arm: Arm, request: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Run one task request in a fresh process of ``arm``; return its JSON result."""

    def fallback(self, *, root: Path, reporter: Reporter) -> dict[str, Any]:
        """What `check` runs instead when the engine is unavailable here (e.g. the patch-level CPU tests)."""

    def census_scenarios(self) -> tuple[str, ...]:
        """The mechanism-census scenarios (overlay.mechanism.SCENARIOS) this adapter's ``census`` task runs on this
        machine; a declared mechanism in any other scenario is reported as not measured."""


_REGISTRY: dict[str, Callable[[], EngineAdapter]] = {}


def register(engine: str) -> Callable[[Callable[[], EngineAdapter]], Callable[[], EngineAdapter]]:
    def deco(factory: Callable[[], EngineAdapter]) -> Callable[[], EngineAdapter]:
        _REGISTRY[engine] = factory
        return factory

    return deco


def get_adapter(engine: str) -> EngineAdapter:
    from overlay.engines import exllamav3, mlx_lm, sglang  # noqa: F401  (modules register themselves)

    if engine not in _REGISTRY:
        raise UsageError(f"no check adapter for engine {engine!r}", tip=f"adapters exist for: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[engine]()


WORKERS = Path(__file__).parent / "workers"
