"""A tiny DeepSeek-V3 checkpoint with one NextN (MTP) layer, for SGLang's NEXTN path on the CPU engine.

Built from the ``deepseek_v3-random`` recipe's shape and the tiny-model weight functions
(``overlay.check.models.weights``), with three changes, each needed on this path:

- 2 decoder layers (layer 0 dense, layer 1 MoE) instead of 61, so the NextN layer is ``model.layers.2`` (SGLang
  0.5.23 loads the NextN layer from ``model.layers.{num_hidden_layers}``, ``deepseek_weight_loader.py``
  ``_initialize_nextn_conf``) and an engine step costs 3 layers, not 62;
- ``rope_scaling`` of type yarn with factor 1 (numerically plain RoPE): SGLang's CPU RoPE factory
  (``rotary_embedding/factory.py`` ``get_rope_cpu``) only builds ``deepseek_yarn`` and asserts on ``None``, so the
  recipe's ``rope_scaling: null`` cannot start the CPU engine;
- the NextN layer is built to agree with the target part of the time: ``eh_proj = [I | ALPHA * I]`` (the next
  token's normed embedding plus a little of the target's hidden state), so its draft is mostly a bigram of the
  embedding and the lm_head, and the target's residual branches (``o_proj``, ``down_proj`` of layers 0-1) run at
  half gain, so the embedding decides the target's next token about half the time (HF transformers, 156
  positions: 55 % agree with that bigram at gain 0.5, 35 % at the recipe's gain). With the recipe's random head
  nothing is ever accepted (measured on this engine: 0 accepted drafts in 46 verifies of 3 drafts each), which
  leaves nothing for acceptance statistics to show. The NextN decoder layer keeps its random weights (they shift
  the draft, and run the real NextN layer's MLA attention and MoE).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

NUM_HIDDEN_LAYERS = 2
FIRST_K_DENSE_REPLACE = 1
ALPHA = 0.25
TARGET_BRANCH_GAIN = 0.5
ROPE_SCALING = {
    "type": "yarn",
    "factor": 1.0,
    "original_max_position_embeddings": 2048,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def _layer(name: str) -> int:
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else -1


def nextn_config_and_tensors(seed: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from overlay.check.models import weights as W
    from overlay.check.models.recipes import KINDS, DeepseekV3Shape, RandomRecipe

    recipe = KINDS["deepseek_v3-random"]
    assert isinstance(recipe, RandomRecipe) and isinstance(recipe.shape, DeepseekV3Shape)
    base = recipe.shape
    shape = dataclasses.replace(
        base, num_hidden_layers=NUM_HIDDEN_LAYERS, first_k_dense_replace=FIRST_K_DENSE_REPLACE
    )
    config = {**W.deepseek_v3_config(shape), "rope_scaling": dict(ROPE_SCALING)}
    tensors = W.deepseek_v3_weights(shape, W.Init(seed, 1.0))
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")) and _layer(name) < NUM_HIDDEN_LAYERS:
            tensors[name] = tensors[name] * np.float32(TARGET_BRANCH_GAIN)
    h = shape.hidden_size
    eye = np.eye(h, dtype=np.float32)
    tensors[f"model.layers.{NUM_HIDDEN_LAYERS}.eh_proj.weight"] = np.concatenate(
        [eye, np.float32(ALPHA) * eye], axis=1
    )
    return config, tensors


def build_nextn_checkpoint(out: Path, seed: int = 0) -> Path:
    """Write the checkpoint (config, weights, tokenizer) into ``out`` and return it."""
    from overlay.check.models.common import write_model_files

    out.mkdir(parents=True, exist_ok=True)
    config, tensors = nextn_config_and_tensors(seed)
    write_model_files(out, config, tensors)
    return out
