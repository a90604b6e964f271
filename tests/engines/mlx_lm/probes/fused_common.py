"""Shared helpers of the fused-dispatch / sampling / platform probes (run inside an arm's interpreter).

Imported by the probe scripts next to it (a script's folder is on sys.path). Tiny fp32 models are built from the
config dicts below with fixed-seed random weights and saved once (safetensors + config.json) into a folder both arms
load, so stock and patched see identical bytes. Token ids are fed directly; no tokenizer is needed.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx.utils import tree_flatten

VOCAB = 256

_BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}

_MLA: dict[str, Any] = {
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.5,
    "norm_topk_prob": True,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "attention_bias": False,
    "num_key_value_heads": 4,
}

CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {**_BASE, "model_type": "llama"},
    "llama_draft": {
        **_BASE,
        "model_type": "llama",
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
    "llama_mid": {
        **_BASE,
        "model_type": "llama",
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "intermediate_size": 1408,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
    "llama3_rope": {
        **_BASE,
        "model_type": "llama",
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    },
    "qwen2": {**_BASE, "model_type": "qwen2"},
    "qwen3": {**_BASE, "model_type": "qwen3", "head_dim": 16},
    "qwen3_moe": {
        **_BASE,
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
    "qwen3_next": {
        **_BASE,
        "model_type": "qwen3_next",
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 32,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "partial_rotary_factor": 0.25,
        "full_attention_interval": 2,
        "norm_topk_prob": True,
    },
    "qwen3_5": {
        **_BASE,
        "model_type": "qwen3_5",
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "rope_parameters": {"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    },
    "deepseek_v3": {**_BASE, **_MLA, "model_type": "deepseek_v3"},
    "glm4_moe": {
        **_BASE,
        "model_type": "glm4_moe",
        "head_dim": 16,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.5,
        "norm_topk_prob": True,
        "use_qk_norm": True,
        "attention_bias": False,
        "partial_rotary_factor": 0.5,
        "rope_scaling": None,
    },
    "deepseek_v32": {
        **_BASE,
        **_MLA,
        "model_type": "deepseek_v32",
        "index_head_dim": 32,
        "index_n_heads": 4,
        "index_topk": 16,
    },
    "glm_moe_dsa": {
        **_BASE,
        **_MLA,
        "model_type": "glm_moe_dsa",
        "index_head_dim": 32,
        "index_n_heads": 4,
        "index_topk": 16,
        "rope_parameters": {"rope_theta": 10000.0, "type": "default"},
    },
}


def patched_flavour() -> str:
    """``ovl`` when the installed mlx-lm is an overlay build (local version label), else ``stock``."""
    from importlib.metadata import version

    return "patched" if "+" in version("mlx-lm") else "stock"


def build_model(
    family: str, *, seed: int = 0, quantize: dict[str, int] | None = None
) -> tuple[nn.Module, dict[str, Any]]:
    """A fresh model of ``family`` with fixed-seed random weights (norm weights perturbed around 1)."""
    from mlx_lm.utils import _get_classes

    config = json.loads(json.dumps(CONFIGS[family]))
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    rng = np.random.default_rng(seed)
    new = []
    for name, p in tree_flatten(model.parameters()):
        if p.ndim == 1 and ("norm" in name or name.endswith("dt_bias")):
            v = 1.0 + 0.2 * rng.standard_normal(p.shape)
        elif p.ndim == 1:
            v = 0.1 * rng.standard_normal(p.shape)
        else:
            fan_in = p.shape[-1]
            v = rng.standard_normal(p.shape) / np.sqrt(fan_in)
            if "embed" in name:
                v = rng.standard_normal(p.shape)
        new.append((name, mx.array(v.astype(np.float32))))
    model.load_weights(new)
    if quantize:
        nn.quantize(model, group_size=quantize["group_size"], bits=quantize["bits"])
        config["quantization"] = dict(quantize)
    mx.eval(model.parameters())
    return model, config


def ensure_model(
    root: str | os.PathLike[str], family: str, *, quantize: dict[str, int] | None = None
) -> Path:
    """The saved tiny model of ``family`` under ``root`` (built the first time; atomic publish)."""
    name = family + (f"-q{quantize['bits']}g{quantize['group_size']}" if quantize else "")
    path = Path(root) / name
    if (path / "config.json").is_file():
        return path
    model, config = build_model(family, quantize=quantize)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    mx.save_safetensors(str(tmp / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    try:
        os.replace(tmp, path)
    except OSError:  # another process published it first
        pass
    return path


def load(path: Path) -> nn.Module:
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path))
    return model


def prompt_tokens(seed: int, n: int) -> mx.array:
    rng = np.random.default_rng(1000 + seed)
    return mx.array(rng.integers(3, VOCAB, size=n).astype(np.int32)).astype(mx.uint32)


def count_primitives(*outputs: mx.array) -> dict[str, Any]:
    """Primitive nodes (rectangles) of the graph that computes ``outputs``, by primitive name."""
    with tempfile.NamedTemporaryFile("w+", suffix=".dot") as fh:
        mx.export_to_dot(fh.name, *outputs)
        text = Path(fh.name).read_text()
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if "shape=rectangle" not in line:
            continue
        m = re.search(r'label\s*=\s*"([^"]*)"', line)
        name = m.group(1) if m else "?"
        counts[name] = counts.get(name, 0) + 1
    return {"total": sum(counts.values()), "by_name": dict(sorted(counts.items()))}


def greedy_step_primitives(model: nn.Module, prompt: mx.array) -> dict[str, Any]:
    """Primitives of one greedy decode step exactly as ``generate_step`` builds it.

    ``mx.async_eval`` is intercepted: calls before the decode step are evaluated synchronously, and the graph of
    the first decode step (the second ``_step``) is exported before it runs.
    """
    from mlx_lm.generate import generate_step

    calls: list[dict[str, Any]] = []
    real_async_eval = mx.async_eval

    def fake_async_eval(*arrays: Any) -> None:
        if len(calls) == 1:
            calls.append(count_primitives(*[a for a in arrays if isinstance(a, mx.array)]))
        else:
            calls.append({})
        mx.eval(*arrays)

    mx.async_eval = fake_async_eval
    try:
        gen = generate_step(prompt, model, max_tokens=3)
        for _ in gen:
            pass
    finally:
        mx.async_eval = real_async_eval
    return calls[1]


def logits_rollout(
    model: nn.Module, prompt: mx.array, steps: int, chunk: int = 0
) -> tuple[np.ndarray, list[int]]:
    """Prefill ``prompt`` (in chunks of ``chunk`` tokens when set) then ``steps`` greedy decode steps; the
    last-position logits of each step (fp32)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    if chunk:
        while prompt.size - chunk > 0:
            model(prompt[None, :chunk], cache=cache)
            mx.eval([c.state for c in cache])
            prompt = prompt[chunk:]
    logits = model(prompt[None], cache=cache)[:, -1, :]
    rows = []
    toks = []
    for _ in range(steps):
        mx.eval(logits)
        rows.append(np.array(logits.astype(mx.float32))[0])
        tok = int(mx.argmax(logits, axis=-1).item())
        toks.append(tok)
        logits = model(mx.array([[tok]], dtype=mx.uint32), cache=cache)[:, -1, :]
    return np.stack(rows), toks


def greedy_tokens(model: nn.Module, prompt: mx.array, n: int) -> list[int]:
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in zip((tok for tok, _ in generate_step(prompt, model, max_tokens=n)), range(n))]
