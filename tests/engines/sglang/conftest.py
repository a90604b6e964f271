"""Fixtures for the SGLang series tests (stock vs patched, CPU).

Both arms run SGLang 0.5.23 on the CPU through the labelled test backend in support/testbackends/sglang (see
docs/engines/sglang.md). To keep CI time down, every unit case runs in ONE probe process per arm
(``probes/units.py``, cached for the session), and every engine run in ONE ``run_engine.py`` process per arm
(see sglang_support.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_support import UnitCases

from overlay.check.envs import Arms


@pytest.fixture(scope="module")
def units(arms: Arms) -> UnitCases:
    return UnitCases(arms)
