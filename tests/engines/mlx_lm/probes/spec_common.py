"""Shared helpers of the speculative-decoding probes (tests/engines/mlx_lm/test_spec_*.py).

Runs inside an arm (stock or patched mlx-lm venv), never imported by overlay. Tiny fp32 models are built from an
mlx-lm config dict with fixed-seed random weights and saved once (``build``), so both arms load the same bytes.
A word-level tokenizer (token ``<i>`` for id i) makes ``mlx_lm.load`` and ``stream_generate`` work without a
download. Drafters: ``self`` (the target's own weights), ``noisy`` (the target plus relative Gaussian noise: partial
acceptance), ``random`` (another seed: almost never accepted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten, tree_map

VOCAB = 256


def _llama(layers: int = 2, hidden: int = 64, **extra: Any) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        **extra,
    }


def _qwen3(layers: int = 2, hidden: int = 64) -> dict[str, Any]:
    """No ``make_cache``: ``max_kv_size`` gives it ``RotatingKVCache(max_kv_size, keep=4)`` layers."""
    return {
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
    }


def _qwen3_5(layers: int = 4, hidden: int = 64) -> dict[str, Any]:
    text = {
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attn_output_gate": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    }
    return {"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": False}


def _gemma3(layers: int = 3, hidden: int = 64, window: int = 12) -> dict[str, Any]:
    return {
        "model_type": "gemma3_text",
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "sliding_window": window,
        "sliding_window_pattern": 3,
        "query_pre_attn_scalar": 16,
        "rope_theta": 10000.0,
        "rope_local_base_freq": 10000.0,
    }


ARCHS = {"llama": _llama, "qwen3": _qwen3, "qwen3_5": _qwen3_5, "gemma3": _gemma3}


def _tokenizer_files(path: Path) -> None:
    vocab = {f"<{i}>": i for i in range(VOCAB)}
    tok: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<0>"},
    }
    (path / "tokenizer.json").write_text(json.dumps(tok))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": f"<{VOCAB - 1}>",
                "unk_token": "<0>",
                "model_max_length": 100000,
            }
        )
    )


ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def _randomize(model: nn.Module, seed: int, sharpen: float, attn_gain: float) -> None:
    """Gaussian fan-in weights; ``sharpen`` scales the embeddings and head (peaky logits), ``attn_gain`` the
    attention projections (sharp attention with a large output: the next token depends on the context)."""
    mx.random.seed(seed)
    flat = []
    for name, p in tree_flatten(model.parameters()):
        if p.ndim >= 2:
            scale = 1.0 / (p.shape[-1] ** 0.5)
            if "embed" in name or "lm_head" in name:
                scale *= sharpen
            if any(a in name for a in ATTN):
                scale *= attn_gain
            flat.append((name, mx.random.normal(p.shape, dtype=p.dtype) * scale))
        elif "norm" in name or "A_log" in name or "dt_bias" in name:
            flat.append((name, p + 0.05 * mx.random.normal(p.shape, dtype=p.dtype)))
        else:
            flat.append((name, 0.1 * mx.random.normal(p.shape, dtype=p.dtype)))
    # The EOS row of the output head is zero, so greedy decoding never stops early (logits of the others ~ N(0, 4)).
    flat = [(n, p.at[VOCAB - 1].multiply(0.0) if n.endswith("lm_head.weight") else p) for n, p in flat]
    model.load_weights(flat)


def _save(model: nn.Module, config: dict[str, Any], path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=1))
    _tokenizer_files(path)


def build(
    path: str,
    arch: str,
    *,
    seed: int = 0,
    sharpen: float = 4.0,
    attn_gain: float = 1.0,
    like: str | None = None,
    noise: float = 0.0,
    **shape: Any,
) -> str:
    """Write a tiny model to ``path`` (skip if there). ``like``: start from that model's weights, plus ``noise``
    (relative Gaussian noise per tensor, seeded by ``seed``)."""
    from mlx_lm.utils import _get_classes, load_model

    out = Path(path)
    if (out / "config.json").is_file():
        return path
    if like is not None:
        model, config = load_model(Path(like))
        if noise:
            mx.random.seed(seed)
            model.update(
                tree_map(
                    lambda p: (
                        p + noise * mx.std(p) * mx.random.normal(p.shape, dtype=p.dtype) if p.ndim >= 2 else p
                    ),
                    model.parameters(),
                )
            )
        _save(model, config, out)
        return path
    config = ARCHS[arch](**shape)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    _randomize(model, seed, sharpen, attn_gain)
    _save(model, config, out)
    return path


def load(path: str) -> nn.Module:
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path))
    return model


def prompt(seed: int, length: int) -> list[int]:
    mx.random.seed(10_000 + seed)
    tokens: list[int] = mx.random.randint(1, VOCAB - 1, (length,)).tolist()
    return tokens


def serial(model: nn.Module, ids: list[int], n: int, **kwargs: Any) -> list[int]:
    """Stock serial greedy decoding: the reference every speculative configuration must match."""
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n, **kwargs)]


# The model set of the speculative-decoding tests: name -> build() arguments. Drafters derived with ``like`` follow
# their base (dict order).
MODELS: dict[str, dict[str, Any]] = {
    "qwen3": {"arch": "qwen3", "seed": 1},
    "qwen3-noisy": {"arch": "qwen3", "seed": 2, "like": "qwen3", "noise": 0.02},
    "qwen3-random": {"arch": "qwen3", "seed": 3},
    "hybrid": {"arch": "qwen3_5", "seed": 4},
    "hybrid-noisy": {"arch": "qwen3_5", "seed": 5, "like": "hybrid", "noise": 0.05},
    "hybrid-random": {"arch": "qwen3_5", "seed": 6},
    "gemma": {"arch": "gemma3", "seed": 7},
    "gemma-noisy": {"arch": "gemma3", "seed": 8, "like": "gemma", "noise": 0.05},
}


def build_set(out: str) -> dict[str, str]:
    """Build :data:`MODELS` under ``out/spec-<key>/`` (key: this file and the mlx / mlx-lm versions), once."""
    import hashlib
    import importlib.metadata

    from build_once import build_once

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(json.dumps([importlib.metadata.version("mlx"), importlib.metadata.version("mlx-lm")]).encode())

    def make(scratch: Path) -> None:
        for name, spec in MODELS.items():
            spec = dict(spec)
            if spec.get("like"):
                spec["like"] = str(scratch / spec["like"])
            build(str(scratch / name), **spec)
        (scratch / "models.json").write_text(json.dumps(sorted(MODELS)))

    final = build_once(Path(out), f"spec-{h.hexdigest()[:12]}", make)
    return {name: str(final / name) for name in MODELS}
