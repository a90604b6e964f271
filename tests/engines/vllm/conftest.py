"""Fixtures the vLLM engine tests share: the check's arms (stock and the patched series) and the tiny random llama.

A test module that needs other arms (the series up to one patch, or the stock arm alone) defines its own fixture of
the same name, which takes precedence for that module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check import models as tinymodels
from overlay.check.envs import Arms, arms_for
from overlay.engines import get_adapter
from overlay.schemas.documents import CensusRequest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def arms() -> Arms:
    return arms_for(REPO, "vllm")


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymodels.build("llama-random", root=REPO)


@pytest.fixture(scope="module")
def cold(arms: Arms, model: Path) -> dict[str, dict[str, Any]]:
    """One ``cold-start`` census per arm of the module's ``arms``, the default layout (0001's flag off: every process
    spawned, as in stock)."""
    request: CensusRequest = {"task": "census", "model": str(model), "scenario": "cold-start", "steps": 1}
    return {
        name: get_adapter("vllm").run(arm, request, timeout=1800)
        for name, arm in (("stock", arms.stock), ("patched", arms.patched))
    }
