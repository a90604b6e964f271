"""What every kind's builder shares: its context, and the files of a model directory (``config.json``,
``generation_config.json``, ``model.safetensors``, the tokenizer), written deterministically."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from overlay.check.models import olmo3
from overlay.check.models import weights as W
from overlay.check.models.recipes import (
    DeepseekV3Shape,
    LlamaShape,
    NextnRecipe,
    Olmo3Shape,
    Qwen35Shape,
    RandomRecipe,
    Recipe,
    TrainedRecipe,
)
from overlay.check.models.tokenizer import write_tokenizer
from overlay.progress import Reporter


@dataclass(frozen=True)
class BuildContext:
    kind: str
    root: Path
    seed: int
    scratch: Path
    python: Path | None
    reporter: Reporter


Builder = Callable[[Recipe, Path, BuildContext], dict[str, Any]]


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_tensors(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    """Write fp32 tensors as safetensors (sorted names, ``{"format": "pt"}``): byte-identical for equal inputs."""
    from safetensors.numpy import save_file

    ordered = {name: np.ascontiguousarray(tensors[name]) for name in sorted(tensors)}
    for name, value in ordered.items():
        if value.dtype != np.float32:
            raise ValueError(f"tensor {name} has dtype {value.dtype}; tiny models are float32 only")
    save_file(ordered, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def load_tensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return dict(load_file(str(path)))


def write_model_files(out: Path, config: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", W.generation_config())
    save_tensors(out / "model.safetensors", tensors)
    write_tokenizer(out)


def config_and_tensors(
    recipe: RandomRecipe | TrainedRecipe, init: W.Init
) -> tuple[dict[str, Any], W.Tensors]:
    shape = recipe.shape
    if isinstance(shape, LlamaShape):
        return W.llama_config(shape), W.llama_weights(shape, init)
    if isinstance(shape, Qwen35Shape):
        return W.qwen35_config(shape), W.qwen35_weights(shape, init)
    if isinstance(shape, DeepseekV3Shape):
        return W.deepseek_v3_config(shape), W.deepseek_v3_weights(shape, init)
    if isinstance(shape, Olmo3Shape):
        return olmo3.config(shape), olmo3.weights(shape, init)
    raise TypeError(f"no weights for shape {type(shape).__name__}")


def mtp_details(recipe: RandomRecipe | TrainedRecipe | NextnRecipe) -> dict[str, Any]:
    shape = recipe.shape
    if isinstance(shape, Qwen35Shape):
        return {"mtp": {"style": "qwen3_next", "num_layers": shape.mtp_num_hidden_layers}}
    if isinstance(shape, DeepseekV3Shape):
        return {
            "mtp": {"style": "deepseek_v3", "num_layers": shape.num_nextn_predict_layers},
            "mtp_layer_prefix": f"model.layers.{shape.num_hidden_layers}.",
        }
    return {}
