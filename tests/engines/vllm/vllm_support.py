"""What the vLLM engine tests share besides the conftest's fixtures (imported as a top-level module: pytest puts this
folder on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from overlay.check.envs import Arm
from overlay.engines import get_adapter
from overlay.schemas.documents import CensusRequest


def census(
    arm: Arm, model: Path, scenario: str, *, env: dict[str, str] | None = None, steps: int = 3
) -> dict[str, Any]:
    """One census ``scenario`` of ``steps`` counted steps in ``arm`` (with ``env`` on top of its environment)."""
    request = cast(
        CensusRequest, {"task": "census", "model": str(model), "scenario": scenario, "steps": steps}
    )
    result: dict[str, Any] = get_adapter("vllm").run(arm.with_env(env), request)
    return result
