"""Tiny models for checks, per-patch tests and benchmarks, generated locally (no weight downloads).

``build(kind, root=...)`` returns an HF-format model directory (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``) cached under
``root/build/models/<kind>-<recipehash12>/``. :data:`KINDS` lists the recipes, :data:`PROMPTS` the prompt set by
category. Random kinds need numpy, safetensors and tokenizers; trained kinds also need an interpreter with mlx and
mlx-lm (``python=``). See docs/models.md.
"""

from __future__ import annotations

from overlay.check.models.builder import (
    GENERATOR_VERSION,
    build,
    get_recipe,
    is_built,
    model_dir,
    read_manifest,
    recipe_hash,
)
from overlay.check.models.corpus import CATEGORIES, PROMPTS, all_prompts
from overlay.check.models.mlxproc import probe_mlx_python, stock_mlx_python
from overlay.check.models.recipes import KINDS, is_nextn, is_trained
from overlay.check.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

__all__ = [
    "BOS_ID",
    "CATEGORIES",
    "EOS_ID",
    "GENERATOR_VERSION",
    "KINDS",
    "PAD_ID",
    "PROMPTS",
    "VOCAB_SIZE",
    "all_prompts",
    "build",
    "get_recipe",
    "is_built",
    "is_nextn",
    "is_trained",
    "model_dir",
    "probe_mlx_python",
    "read_manifest",
    "recipe_hash",
    "stock_mlx_python",
]
