"""Fixtures of the speculative-decoding tests (test_spec_*.py, test_max_kv_size_draft.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlay.check.envs import Arms

SPEC_BUILD = Path(__file__).parent / "probes" / "spec_build.py"


@pytest.fixture(scope="module")
def models(arms: Arms, repo_root: Path) -> dict[str, str]:
    """The tiny fp32 models of probes/spec_build.py (fixed-seed random weights), built once by the stock arm and
    cached under build/models. Modules with models of their own define their own ``models`` fixture."""
    built: dict[str, str] = arms.stock.run_json(SPEC_BUILD, {"out": str(repo_root / "build" / "models")})[
        "models"
    ]
    return built
