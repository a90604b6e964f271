"""Probe: text-tower-only loading of a sharded multimodal checkpoint.

Payload: {"mode": "make" | "load" | "guard", ...}.

- make: {"src": a tiny qwen3_5 HF folder (probes/mtp_build.py), "dst": folder}. Writes the same tensors as four
  shards with a ``model.safetensors.index.json``: two text shards, one holding only ``mtp.*``, one holding only a
  (random) ``model.visual.*`` tower, and a config with a ``vision_config``. Result: {"shards": {file: [names]}}.
- load: {"dir", "tokens", "configs": [model_config or null, ...], "env": {VAR: value}}. Result per config (in
  order): "files_read" (names passed to mx.load), "logits" digest, "params" count and digest of the parameter
  names and values, "has_mtp".
- guard (patched arm only): the shards ``skip_tower_shards`` keeps for a model that has parameters under
  ``visual`` (a model that keeps its vision tower). Result: {"kept": [file names]}.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten
from mtp_common import digest
from probe_io import emit, log, read_payload


def make(src: Path, dst: Path) -> dict[str, Any]:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    config = json.loads((src / "config.json").read_text())
    config["vision_config"] = {"depth": 1, "hidden_size": 16, "model_type": "qwen3_5"}
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    weights = mx.load(str(src / "model.safetensors"))
    text = sorted(k for k in weights if not k.startswith("mtp."))
    mx.random.seed(7)
    visual = {
        "model.visual.patch_embed.proj.weight": mx.random.normal((16, 3, 2, 2, 2)),
        "model.visual.blocks.0.attn.qkv.weight": mx.random.normal((48, 16)),
        "model.visual.merger.mlp.0.weight": mx.random.normal((64, 64)),
    }
    shards = {
        "model-00001-of-00004.safetensors": {k: weights[k] for k in text[: len(text) // 2]},
        "model-00002-of-00004.safetensors": {k: weights[k] for k in text[len(text) // 2 :]},
        "model-00003-of-00004.safetensors": {k: v for k, v in weights.items() if k.startswith("mtp.")},
        "model-00004-of-00004.safetensors": visual,
    }
    weight_map = {}
    for name, tensors in shards.items():
        mx.save_safetensors(str(dst / name), tensors, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {"shards": {name: sorted(t) for name, t in shards.items()}}


def load(model_dir: Path, tokens: list[int], configs: list[Any]) -> list[dict[str, Any]]:
    from mlx_lm.utils import load_model

    calls: list[str] = []
    original = mx.load

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(Path(str(path)).name)
        return original(path, *args, **kwargs)

    out = []
    for model_config in configs:
        log(f"loading_text_tower: load {model_dir.name} model_config={model_config}")
        calls.clear()
        mx.load = counting
        try:
            model, _ = load_model(model_dir, model_config=model_config)
        finally:
            mx.load = original
        params = tree_flatten(model.parameters())
        h = hashlib.sha256()
        for name, value in params:
            h.update(name.encode())
            h.update(digest(value).encode())
        owner = getattr(model, "language_model", model)
        out.append(
            {
                "files_read": sorted(calls),
                "logits": digest(model(mx.array([tokens]))),
                "params": len(params),
                "params_digest": h.hexdigest(),
                "has_mtp": "mtp" in owner,
            }
        )
    return out


def guard(model_dir: Path) -> dict[str, Any]:
    from mlx_lm.utils import skip_tower_shards

    class WithVision(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.visual = nn.Linear(2, 2)

    files = sorted(str(p) for p in model_dir.glob("model*.safetensors"))
    kept = skip_tower_shards(model_dir, files, WithVision(), keep_mtp=False)
    return {"kept": [Path(f).name for f in kept]}


def main() -> None:
    payload = read_payload()
    os.environ.update(payload.get("env", {}))
    if payload["mode"] == "make":
        emit(make(Path(payload["src"]), Path(payload["dst"])))
    elif payload["mode"] == "load":
        emit(load(Path(payload["dir"]), payload["tokens"], payload["configs"]))
    else:
        emit(guard(Path(payload["dir"])))


if __name__ == "__main__":
    main()
