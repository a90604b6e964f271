"""Engines behind one Protocol (:class:`overlay.check.adapter.EngineAdapter`), in one explicit registry.

An adapter knows how to run `overlay check`'s tasks in an arm (a venv holding the stock or the patched wheel) on this
machine, which bundled models to use, and, where the engine cannot run here, what to do instead. Adding an engine is
adding its manifest (overlays/ENGINE.toml) and, for `check`, one module here plus its line in :data:`ADAPTERS`.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from overlay.check.adapter import TASKS, EngineAdapter, Models
from overlay.errors import UsageError

__all__ = ["ADAPTERS", "TASKS", "WORKERS", "EngineAdapter", "Models", "get_adapter"]

# engine name (the manifest's engine.name) -> "module:class" of its check adapter
ADAPTERS: dict[str, str] = {
    "exllamav3": "overlay.engines.exllamav3:ExLlamaV3Adapter",
    "mlx-lm": "overlay.engines.mlx_lm:MlxLmAdapter",
    "sglang": "overlay.engines.sglang:SglangAdapter",
    "vllm": "overlay.engines.vllm:VllmAdapter",
}

WORKERS = Path(__file__).parent / "workers"


def get_adapter(engine: str) -> EngineAdapter:
    if engine not in ADAPTERS:
        raise UsageError(
            f"no check adapter for engine {engine!r}",
            tip=f"adapters exist for: {', '.join(sorted(ADAPTERS))} (overlay.engines.ADAPTERS)",
        )
    module, _, cls = ADAPTERS[engine].partition(":")
    adapter: EngineAdapter = getattr(importlib.import_module(module), cls)()
    return adapter
