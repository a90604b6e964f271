"""What the vLLM engine tests share besides the conftest's fixtures (imported as a top-level module: pytest puts this
folder on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from overlay.check import models as tinymodels
from overlay.check.envs import Arm, Arms
from overlay.engines import get_adapter
from overlay.schemas.documents import CensusRequest

REPO = Path(__file__).resolve().parents[3]


def census(
    arm: Arm,
    model: Path,
    scenario: str,
    *,
    env: dict[str, str] | None = None,
    steps: int = 3,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One census ``scenario`` of ``steps`` counted steps in ``arm`` (with ``env`` on top of its environment;
    ``extra``: more request fields, e.g. the spec scenarios' ``draft``)."""
    request = cast(
        CensusRequest,
        {"task": "census", "model": str(model), "scenario": scenario, "steps": steps, **(extra or {})},
    )
    result: dict[str, Any] = get_adapter("vllm").run(arm.with_env(env), request)
    return result


def census_flag(
    arms: Arms, model: Path, scenario: str, flag: dict[str, str], *, steps: int = 3, stock: bool = True
) -> dict[str, dict[str, Any]]:
    """The census ``scenario`` in the patched arm with its ``flag`` off ("off") and on ("flag"), and in the stock arm
    ("stock", unless ``stock`` is False)."""
    runs = {"stock": arms.stock} if stock else {}
    runs |= {"flag": arms.patched.with_env(flag), "off": arms.patched}
    return {name: census(arm, model, scenario, steps=steps) for name, arm in runs.items()}


def trained_target() -> Path:
    """llama-target, the check's target (trained with the stock mlx-lm arm): peaked next-token distributions, and
    sampled outputs that repeat phrases (the n-gram proposer keeps drafting at temperature 0.7 and above)."""
    return tinymodels.build("llama-target", root=REPO, python=tinymodels.stock_mlx_python(REPO))


HYBRID_KIND = (
    "qwen3_5-mtp-gdn64"  # the hybrid the CPU gated-delta kernels take (head dims 64/128), with its MTP head
)


def hybrid_model() -> Path:
    """The bundled hybrid qwen3_5 with a trained MTP head (trained with the stock mlx-lm arm)."""
    return tinymodels.build(HYBRID_KIND, root=REPO, python=tinymodels.stock_mlx_python(REPO))


def tokenized_prompts(arms: Arms, model: Path) -> list[list[int]]:
    """The check's prompts as ``model``'s token ids (stock's tokenizer)."""
    texts = [text for _, text in tinymodels.all_prompts()]
    ids: list[list[int]] = get_adapter("vllm").run(
        arms.stock, {"task": "tokenize", "model": str(model), "prompts": texts}
    )["ids"]
    return ids
