"""The tiny DeepSeek-V3 checkpoint with one NextN (MTP) layer for SGLang's NEXTN path on the CPU engine: the bundled
kind ``deepseek_v3-nextn-random`` (one definition: the recipe in ``overlay.check.models.recipes``, its weights in
``overlay.check.models.nextn``; docs/models.md says why each of its choices is needed on this path).

2 decoder layers (layer 0 dense, layer 1 MoE), the NextN layer at ``model.layers.2``, ``rope_scaling`` yarn with
factor 1, ``eh_proj = [I | 0.25 I]`` and the target's ``o_proj`` / ``down_proj`` at half gain, so the real NextN head
is accepted part of the time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from overlay.check.models import build, nextn
from overlay.check.models.recipes import KINDS, NextnRecipe

KIND = "deepseek_v3-nextn-random"


def _recipe() -> NextnRecipe:
    recipe = KINDS[KIND]
    assert isinstance(recipe, NextnRecipe)
    return recipe


RECIPE = _recipe()
NUM_HIDDEN_LAYERS = nextn.nextn_layer(RECIPE)


def nextn_config_and_tensors(seed: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The kind's config and tensors, as its build writes them."""
    return nextn.config_and_tensors(RECIPE, seed)


def build_nextn_checkpoint(root: Path, seed: int = 0) -> Path:
    """Build the kind (cached under ``root/build/models/``) and return its model directory."""
    return build(KIND, root=root, seed=seed)
