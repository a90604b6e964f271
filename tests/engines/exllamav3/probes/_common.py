"""Shared helpers for the exllamav3 probes (run inside a stock or patched arm, on CPU, with the extension stand-in).

A probe reads one JSON payload on stdin and prints one JSON document on stdout. Logs go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("EXL3_FUSED_SAMPLER", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def read_payload() -> dict[str, Any]:
    return json.loads(sys.stdin.read() or "{}")


def emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, sort_keys=True))
    sys.stdout.flush()


def is_patched() -> bool:
    from importlib.metadata import version

    return "+" in version("exllamav3")


def write_model(directory: Path, config: dict[str, Any], tensors: dict[str, Any]) -> Path:
    """A model directory with config.json and one safetensors file (random weights, made here)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def tiny_llama(directory: Path, *, layers: int = 2, hidden: int = 128, vocab: int = 512) -> Path:
    import torch

    config = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "intermediate_size": 2 * hidden,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": layers, "rms_norm_eps": 1e-5,
        "vocab_size": vocab, "max_position_embeddings": 4096, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16",
    }
    g = torch.Generator().manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g).half()}
    return write_model(directory, config, tensors)


def tiny_dflash2(
    directory: Path, *, layers: int = 3, hidden: int = 128, kv_heads: int = 2, head_dim: int = 64,
    block: int = 8, layer_types: list[str] | None = None, window: int = 256, vocab: int = 512,
) -> Path:
    import torch

    config = {
        "architectures": ["DFlash2DraftModel"], "hidden_size": hidden, "intermediate_size": 2 * hidden,
        "num_attention_heads": 4, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "num_hidden_layers": layers, "rms_norm_eps": 1e-5, "vocab_size": vocab, "hidden_act": "silu",
        "max_position_embeddings": 1 << 20, "rope_theta": 10000.0, "sliding_window": window,
        "layer_types": layer_types or ["full_attention"] * layers, "block_size": block,
        "dflash_config": {"mask_token_id": vocab - 1, "target_layer_ids": [0, 1], "selector_rank": 16,
                          "selector_top_k": 8},
        "torch_dtype": "float16",
    }
    g = torch.Generator().manual_seed(1)
    tensors = {"fc.weight": torch.randn(hidden, 2 * hidden, generator=g).half()}
    return write_model(directory, config, tensors)


def tiny_dflash(directory: Path, **kwargs: Any) -> Path:
    path = tiny_dflash2(directory, **kwargs)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["DFlashDraftModel"]
    (path / "config.json").write_text(json.dumps(config))
    return path


def run_cases(describe: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Run describe(payload) once, or once per entry of payload["cases"], in this one process, each with its optional
    "env" dict applied around it; emit the document, or {"cases": [documents]}."""
    payload = read_payload()

    def one(case: dict[str, Any]) -> dict[str, Any]:
        saved = {k: os.environ.get(k) for k in case.get("env", {})}
        os.environ.update(case.get("env", {}))
        try:
            return describe(case)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    if "cases" not in payload:
        emit(one(payload))
    else:
        emit({"cases": [one(case) for case in payload["cases"]]})
