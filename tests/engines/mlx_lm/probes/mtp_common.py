"""Shared helpers of the MTP / loading probes (run inside a stock or patched mlx-lm arm, never imported by pytest).

A probe reads one JSON payload on stdin and prints one JSON document on stdout; logs go to stderr.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np


def digest(array: mx.array) -> str:
    """sha256 over dtype, shape and bytes: equal digests mean bit-identical arrays."""
    a = np.array(array)
    h = hashlib.sha256(f"{a.dtype}:{a.shape}:".encode())
    h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def digests(items: Iterable[tuple[str, mx.array]]) -> dict[str, str]:
    return {name: digest(value) for name, value in items}


def raw_weights(model_dir: Path) -> dict[str, mx.array]:
    """Every tensor of the checkpoint's main files (what stock load_model reads)."""
    weights: dict[str, mx.array] = {}
    for path in sorted(model_dir.glob("model*.safetensors")):
        weights.update(mx.load(str(path)))
    return weights


def build_model(model_dir: Path) -> Any:
    """An unloaded model of the checkpoint's class (random init), for calling ``sanitize`` directly."""
    from mlx_lm.utils import _get_classes, load_config

    config = load_config(model_dir)
    model_class, args_class = _get_classes(config)
    return model_class(args_class.from_dict(config))


def mlx_lm_has(module: str, attr: str) -> bool:
    """Whether this arm's mlx-lm has ``module.attr`` (the patched arm has the MTP API, the stock arm does not)."""
    import importlib

    try:
        return hasattr(importlib.import_module(module), attr)
    except ImportError:
        return False
