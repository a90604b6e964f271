"""Fixtures the vLLM engine tests share: the check's arms (stock and the patched series) and the tiny random llama.

A test module that needs other arms (the series up to one patch, or the stock arm alone) defines its own fixture of
the same name, which takes precedence for that module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from overlay.check import models as tinymodels
from overlay.check.envs import Arms, arms_for

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def arms() -> Arms:
    return arms_for(REPO, "vllm")


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymodels.build("llama-random", root=REPO)
