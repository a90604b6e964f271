"""HF-format config and initial weights of the ``olmo3`` tiny models (interleaved sliding-window attention), numpy
only.

The checkpoint layout of OLMo 3 (``Olmo3ForCausalLM``; SGLang loads it as Olmo2ForCausalLM): post-norm blocks
(``post_attention_layernorm`` and ``post_feedforward_layernorm`` on each sublayer's output, no input norm),
``q_norm`` / ``k_norm`` over the whole q and k projections, a SwiGLU MLP, RMSNorm weights ``w`` (``y = rmsnorm(x) *
w``); ``layer_types`` names each layer ``sliding_attention`` or ``full_attention``.
"""

from __future__ import annotations

import math
from typing import Any

from overlay.check.models.recipes import Olmo3Shape
from overlay.check.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE
from overlay.check.models.weights import Init, Tensors


def config(shape: Olmo3Shape) -> dict[str, Any]:
    return {
        "architectures": ["Olmo3ForCausalLM"],
        "model_type": "olmo3",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling": None,
        "sliding_window": shape.sliding_window,
        "layer_types": shape.layer_types(),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }


def weights(shape: Olmo3Shape, init: Init) -> Tensors:
    h, n = shape.hidden_size, shape.num_hidden_layers
    q_out, kv_out = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    out_gain = 1.0 / math.sqrt(2 * n)
    tied = shape.tie_word_embeddings
    tensors: Tensors = {
        "model.embed_tokens.weight": init.embedding(
            "model.embed_tokens.weight", VOCAB_SIZE, h, std=1.0 / math.sqrt(h) if tied else 1.0
        ),
        "model.norm.weight": init.norm("model.norm.weight", h),
    }
    for i in range(n):
        p = f"model.layers.{i}"
        linears = {
            "self_attn.q_proj": (q_out, h, 1.0),
            "self_attn.k_proj": (kv_out, h, 1.0),
            "self_attn.v_proj": (kv_out, h, 1.0),
            "self_attn.o_proj": (h, q_out, out_gain),
            "mlp.gate_proj": (shape.intermediate_size, h, 1.0),
            "mlp.up_proj": (shape.intermediate_size, h, 1.0),
            "mlp.down_proj": (h, shape.intermediate_size, out_gain),
        }
        for name, (out_f, in_f, gain) in linears.items():
            tensors[f"{p}.{name}.weight"] = init.linear(f"{p}.{name}.weight", out_f, in_f, gain=gain)
        norms = {
            "self_attn.q_norm": q_out,
            "self_attn.k_norm": kv_out,
            "post_attention_layernorm": h,
            "post_feedforward_layernorm": h,
        }
        for name, dim in norms.items():
            tensors[f"{p}.{name}.weight"] = init.norm(f"{p}.{name}.weight", dim)
    if not tied:
        tensors["lm_head.weight"] = init.linear("lm_head.weight", VOCAB_SIZE, h)
    return tensors
