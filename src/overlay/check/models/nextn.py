"""Config and weights of a :class:`~overlay.check.models.recipes.NextnRecipe` (``deepseek_v3-nextn-random``).

The deepseek_v3 functions of :mod:`.weights` on the recipe's short shape, then the recipe's three choices: its
``rope_scaling``, the main layers' residual branches (``o_proj``, ``down_proj``) times ``target_branch_gain``, and the
NextN layer's ``eh_proj = [I | eh_alpha * I]``. Measured with HF transformers on 156 positions: the target agrees with
the embedding-lm_head bigram (what the draft mostly is) 55 % of the time at gain 0.5, 35 % at gain 1; with the plain
random NextN layer SGLang accepted 0 drafts in 46 verifies of 3 (docs/engines/sglang.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from overlay.check.models import weights as W
from overlay.check.models.recipes import NextnRecipe

_BRANCH_OUTPUTS = ("o_proj.weight", "down_proj.weight")


def nextn_layer(recipe: NextnRecipe) -> int:
    """The index of the NextN layer: ``model.layers.{num_hidden_layers}``."""
    return recipe.shape.num_hidden_layers


def config(recipe: NextnRecipe) -> dict[str, Any]:
    return {**W.deepseek_v3_config(recipe.shape), "rope_scaling": dict(recipe.rope_scaling)}


def _main_layer(name: str, layers: int) -> bool:
    parts = name.split(".")
    return name.startswith("model.layers.") and int(parts[2]) < layers


def weights(recipe: NextnRecipe, init: W.Init) -> W.Tensors:
    shape = recipe.shape
    tensors = W.deepseek_v3_weights(shape, init)
    gain = np.float32(recipe.target_branch_gain)
    for name in tensors:
        if name.endswith(_BRANCH_OUTPUTS) and _main_layer(name, shape.num_hidden_layers):
            tensors[name] = tensors[name] * gain
    eye = np.eye(shape.hidden_size, dtype=np.float32)
    tensors[f"model.layers.{nextn_layer(recipe)}.eh_proj.weight"] = np.concatenate(
        [eye, np.float32(recipe.eh_alpha) * eye], axis=1
    )
    return tensors


def config_and_tensors(recipe: NextnRecipe, seed: int = 0) -> tuple[dict[str, Any], W.Tensors]:
    return config(recipe), weights(recipe, W.Init(seed, 1.0))
