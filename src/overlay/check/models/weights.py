"""HF-format configs and initial weights of the tiny models, with numpy only.

Initial values come from SHAKE-256 of ``(seed, tensor name)`` turned into uniform floats with exact arithmetic
(integer to float, multiply, add), so a tensor does not depend on the order tensors are made in, on the numpy
version or on the CPU. Linear weights are uniform with standard deviation ``init_scale / sqrt(fan_in)``;
output projections are further scaled by ``1 / sqrt(2 * layers)``.

Norm conventions as stored (the same as the real checkpoints of each family):

- llama, deepseek_v3: RMSNorm weight ``w``, ``y = rmsnorm(x) * w``.
- qwen3_5 (and its ``mtp.*`` block): "zero-centred" RMSNorm, stored ``s``, ``y = rmsnorm(x) * (1 + s)``, for every
  ``*layernorm``, ``*.q_norm``, ``*.k_norm``, ``model.language_model.norm`` and ``mtp.{norm,pre_fc_norm_hidden,
  pre_fc_norm_embedding}``; the gated norm ``linear_attn.norm`` is plain (``w``). ``conv1d.weight`` is stored in the
  HF layout ``(channels, 1, kernel)``; that layout is what makes mlx-lm's ``sanitize`` add 1 to the shifted norms.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from overlay.check.models.recipes import DeepseekV3Shape, LlamaShape, Qwen35Shape
from overlay.check.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

Tensors = dict[str, np.ndarray]

NORM_JITTER = 0.1
"""Half-width of the uniform spread of norm weights around their neutral value (1, or 0 when zero-centred), so a
mishandled norm weight changes the outputs."""


class Init:
    """Deterministic tensors from ``(seed, name)``."""

    def __init__(self, seed: int, init_scale: float = 1.0) -> None:
        self.seed = seed
        self.init_scale = init_scale

    def uniform(self, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
        n = math.prod(shape)
        digest = hashlib.shake_256(f"overlay.tinymodels:{self.seed}:{name}".encode()).digest(4 * n)
        u = np.frombuffer(digest, dtype="<u4").astype(np.float64)
        x = (u + 0.5) * (2.0 / 2**32) - 1.0  # in (-1, 1), exact arithmetic
        return (x * (math.sqrt(3.0) * std)).astype(np.float32).reshape(shape)

    def linear(self, name: str, out_features: int, in_features: int, *, gain: float = 1.0) -> np.ndarray:
        return self.uniform(
            name, (out_features, in_features), gain * self.init_scale / math.sqrt(in_features)
        )

    def embedding(self, name: str, vocab: int, hidden: int, std: float = 1.0) -> np.ndarray:
        return self.uniform(name, (vocab, hidden), std)

    def norm(self, name: str, dim: int, *, zero_centred: bool = False) -> np.ndarray:
        jitter = self.uniform(name, (dim,), NORM_JITTER / math.sqrt(3.0))
        return jitter if zero_centred else (jitter + np.float32(1.0)).astype(np.float32)


def _special_ids() -> dict[str, Any]:
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}


def generation_config() -> dict[str, Any]:
    return {**_special_ids(), "do_sample": False, "_from_model_config": False}


def _dense_dims(shape: LlamaShape | Qwen35Shape) -> dict[str, Any]:
    """The size keys that Llama and Qwen3.5 configs share, in their config.json order."""
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
    }


# --------------------------------------------------------------------------------------------------- llama


def llama_config(shape: LlamaShape) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_dense_dims(shape),
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
        **_special_ids(),
    }


def llama_layer(init: Init, prefix: str, shape: LlamaShape, *, n_layers: int) -> Tensors:
    h, hd = shape.hidden_size, shape.head_dim
    out_gain = 1.0 / math.sqrt(2 * n_layers)
    return {
        f"{prefix}.input_layernorm.weight": init.norm(f"{prefix}.input_layernorm.weight", h),
        f"{prefix}.post_attention_layernorm.weight": init.norm(
            f"{prefix}.post_attention_layernorm.weight", h
        ),
        f"{prefix}.self_attn.q_proj.weight": init.linear(
            f"{prefix}.self_attn.q_proj.weight", shape.num_attention_heads * hd, h
        ),
        f"{prefix}.self_attn.k_proj.weight": init.linear(
            f"{prefix}.self_attn.k_proj.weight", shape.num_key_value_heads * hd, h
        ),
        f"{prefix}.self_attn.v_proj.weight": init.linear(
            f"{prefix}.self_attn.v_proj.weight", shape.num_key_value_heads * hd, h
        ),
        f"{prefix}.self_attn.o_proj.weight": init.linear(
            f"{prefix}.self_attn.o_proj.weight", h, shape.num_attention_heads * hd, gain=out_gain
        ),
        f"{prefix}.mlp.gate_proj.weight": init.linear(
            f"{prefix}.mlp.gate_proj.weight", shape.intermediate_size, h
        ),
        f"{prefix}.mlp.up_proj.weight": init.linear(
            f"{prefix}.mlp.up_proj.weight", shape.intermediate_size, h
        ),
        f"{prefix}.mlp.down_proj.weight": init.linear(
            f"{prefix}.mlp.down_proj.weight", h, shape.intermediate_size, gain=out_gain
        ),
    }


def llama_weights(shape: LlamaShape, init: Init) -> Tensors:
    h = shape.hidden_size
    tied = shape.tie_word_embeddings
    tensors: Tensors = {
        "model.embed_tokens.weight": init.embedding(
            "model.embed_tokens.weight", VOCAB_SIZE, h, std=1.0 / math.sqrt(h) if tied else 1.0
        ),
        "model.norm.weight": init.norm("model.norm.weight", h),
    }
    for i in range(shape.num_hidden_layers):
        tensors.update(llama_layer(init, f"model.layers.{i}", shape, n_layers=shape.num_hidden_layers))
    if not tied:
        tensors["lm_head.weight"] = init.linear("lm_head.weight", VOCAB_SIZE, h)
    return tensors


# --------------------------------------------------------------------------------------------------- qwen3_5

QWEN35_PREFIX = "model.language_model"


def qwen35_layer_types(shape: Qwen35Shape) -> list[str]:
    return [
        "full_attention" if (i + 1) % shape.full_attention_interval == 0 else "linear_attention"
        for i in range(shape.num_hidden_layers)
    ]


def qwen35_config(shape: Qwen35Shape) -> dict[str, Any]:
    rope_dims = int(shape.head_dim * shape.partial_rotary_factor)
    half = rope_dims // 2
    mrope_section = [half - 2 * (half // 4), half // 4, half // 4]
    text_config = {
        "model_type": "qwen3_5_text",
        **_dense_dims(shape),
        "linear_num_key_heads": shape.linear_num_key_heads,
        "linear_num_value_heads": shape.linear_num_value_heads,
        "linear_key_head_dim": shape.linear_key_head_dim,
        "linear_value_head_dim": shape.linear_value_head_dim,
        "linear_conv_kernel_dim": shape.linear_conv_kernel_dim,
        "full_attention_interval": shape.full_attention_interval,
        "layer_types": qwen35_layer_types(shape),
        "hidden_act": "silu",
        "attention_bias": False,
        "attn_output_gate": True,
        "rms_norm_eps": shape.rms_norm_eps,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": shape.rope_theta,
            "partial_rotary_factor": shape.partial_rotary_factor,
            "mrope_section": mrope_section,
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": shape.tie_word_embeddings,
        "mtp_num_hidden_layers": shape.mtp_num_hidden_layers,
        "mtp_use_dedicated_embeddings": False,
        "dtype": "float32",
        **_special_ids(),
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_config,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "torch_dtype": "float32",
        **_special_ids(),
    }


def qwen35_attention(init: Init, prefix: str, shape: Qwen35Shape, *, out_gain: float) -> Tensors:
    h, hd = shape.hidden_size, shape.head_dim
    p = f"{prefix}.self_attn"
    return {
        f"{p}.q_proj.weight": init.linear(f"{p}.q_proj.weight", 2 * shape.num_attention_heads * hd, h),
        f"{p}.k_proj.weight": init.linear(f"{p}.k_proj.weight", shape.num_key_value_heads * hd, h),
        f"{p}.v_proj.weight": init.linear(f"{p}.v_proj.weight", shape.num_key_value_heads * hd, h),
        f"{p}.o_proj.weight": init.linear(
            f"{p}.o_proj.weight", h, shape.num_attention_heads * hd, gain=out_gain
        ),
        f"{p}.q_norm.weight": init.norm(f"{p}.q_norm.weight", hd, zero_centred=True),
        f"{p}.k_norm.weight": init.norm(f"{p}.k_norm.weight", hd, zero_centred=True),
    }


def qwen35_linear_attention(init: Init, prefix: str, shape: Qwen35Shape, *, out_gain: float) -> Tensors:
    h = shape.hidden_size
    key_dim = shape.linear_num_key_heads * shape.linear_key_head_dim
    value_dim = shape.linear_num_value_heads * shape.linear_value_head_dim
    conv_dim = 2 * key_dim + value_dim
    nv = shape.linear_num_value_heads
    p = f"{prefix}.linear_attn"
    a_values = np.linspace(1.0, 16.0, nv)
    return {
        f"{p}.in_proj_qkv.weight": init.linear(f"{p}.in_proj_qkv.weight", conv_dim, h),
        f"{p}.in_proj_z.weight": init.linear(f"{p}.in_proj_z.weight", value_dim, h),
        f"{p}.in_proj_b.weight": init.linear(f"{p}.in_proj_b.weight", nv, h),
        f"{p}.in_proj_a.weight": init.linear(f"{p}.in_proj_a.weight", nv, h),
        f"{p}.conv1d.weight": init.uniform(
            f"{p}.conv1d.weight",
            (conv_dim, 1, shape.linear_conv_kernel_dim),
            1.0 / math.sqrt(shape.linear_conv_kernel_dim),
        ),
        f"{p}.dt_bias": np.ones((nv,), dtype=np.float32),
        f"{p}.A_log": np.array([math.log(a) for a in a_values], dtype=np.float32),
        f"{p}.norm.weight": init.norm(f"{p}.norm.weight", shape.linear_value_head_dim),
        f"{p}.out_proj.weight": init.linear(f"{p}.out_proj.weight", h, value_dim, gain=out_gain),
    }


def qwen35_mlp(init: Init, prefix: str, shape: Qwen35Shape, *, out_gain: float) -> Tensors:
    h, i = shape.hidden_size, shape.intermediate_size
    p = f"{prefix}.mlp"
    return {
        f"{p}.gate_proj.weight": init.linear(f"{p}.gate_proj.weight", i, h),
        f"{p}.up_proj.weight": init.linear(f"{p}.up_proj.weight", i, h),
        f"{p}.down_proj.weight": init.linear(f"{p}.down_proj.weight", h, i, gain=out_gain),
    }


def qwen35_layer(init: Init, prefix: str, shape: Qwen35Shape, *, linear: bool, n_layers: int) -> Tensors:
    out_gain = 1.0 / math.sqrt(2 * n_layers)
    h = shape.hidden_size
    tensors = {
        f"{prefix}.input_layernorm.weight": init.norm(
            f"{prefix}.input_layernorm.weight", h, zero_centred=True
        ),
        f"{prefix}.post_attention_layernorm.weight": init.norm(
            f"{prefix}.post_attention_layernorm.weight", h, zero_centred=True
        ),
    }
    mixer = qwen35_linear_attention if linear else qwen35_attention
    tensors.update(mixer(init, prefix, shape, out_gain=out_gain))
    tensors.update(qwen35_mlp(init, prefix, shape, out_gain=out_gain))
    return tensors


def qwen35_mtp_weights(shape: Qwen35Shape, init: Init) -> Tensors:
    """The ``mtp.*`` block (Qwen3.5 / Qwen3-Next naming): fc, two pre-fc norms, full-attention layers, norm."""
    h = shape.hidden_size
    tensors: Tensors = {
        "mtp.fc.weight": init.linear("mtp.fc.weight", h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": init.norm(
            "mtp.pre_fc_norm_embedding.weight", h, zero_centred=True
        ),
        "mtp.pre_fc_norm_hidden.weight": init.norm("mtp.pre_fc_norm_hidden.weight", h, zero_centred=True),
        "mtp.norm.weight": init.norm("mtp.norm.weight", h, zero_centred=True),
    }
    for j in range(shape.mtp_num_hidden_layers):
        tensors.update(qwen35_layer(init, f"mtp.layers.{j}", shape, linear=False, n_layers=1))
    return tensors


def qwen35_weights(shape: Qwen35Shape, init: Init, *, with_mtp: bool = True) -> Tensors:
    h = shape.hidden_size
    tensors: Tensors = {
        f"{QWEN35_PREFIX}.embed_tokens.weight": init.embedding(
            f"{QWEN35_PREFIX}.embed_tokens.weight", VOCAB_SIZE, h
        ),
        f"{QWEN35_PREFIX}.norm.weight": init.norm(f"{QWEN35_PREFIX}.norm.weight", h, zero_centred=True),
    }
    for i, layer_type in enumerate(qwen35_layer_types(shape)):
        tensors.update(
            qwen35_layer(
                init,
                f"{QWEN35_PREFIX}.layers.{i}",
                shape,
                linear=layer_type == "linear_attention",
                n_layers=shape.num_hidden_layers,
            )
        )
    if not shape.tie_word_embeddings:
        tensors["lm_head.weight"] = init.linear("lm_head.weight", VOCAB_SIZE, h)
    if with_mtp:
        tensors.update(qwen35_mtp_weights(shape, init))
    return tensors


# --------------------------------------------------------------------------------------------------- deepseek_v3


def deepseek_v3_config(shape: DeepseekV3Shape) -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "moe_intermediate_size": shape.moe_intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_nextn_predict_layers": shape.num_nextn_predict_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_attention_heads,
        "q_lora_rank": shape.q_lora_rank,
        "kv_lora_rank": shape.kv_lora_rank,
        "qk_nope_head_dim": shape.qk_nope_head_dim,
        "qk_rope_head_dim": shape.qk_rope_head_dim,
        "v_head_dim": shape.v_head_dim,
        "n_routed_experts": shape.n_routed_experts,
        "n_shared_experts": shape.n_shared_experts,
        "num_experts_per_tok": shape.num_experts_per_tok,
        "n_group": shape.n_group,
        "topk_group": shape.topk_group,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": shape.routed_scaling_factor,
        "first_k_dense_replace": shape.first_k_dense_replace,
        "moe_layer_freq": 1,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        **_special_ids(),
    }


def deepseek_v3_layer(init: Init, prefix: str, shape: DeepseekV3Shape, *, moe: bool) -> Tensors:
    h = shape.hidden_size
    out_gain = 1.0 / math.sqrt(2 * (shape.num_hidden_layers + shape.num_nextn_predict_layers))
    nh = shape.num_attention_heads
    q_head = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    a = f"{prefix}.self_attn"
    tensors = {
        f"{prefix}.input_layernorm.weight": init.norm(f"{prefix}.input_layernorm.weight", h),
        f"{prefix}.post_attention_layernorm.weight": init.norm(
            f"{prefix}.post_attention_layernorm.weight", h
        ),
        f"{a}.q_a_proj.weight": init.linear(f"{a}.q_a_proj.weight", shape.q_lora_rank, h),
        f"{a}.q_a_layernorm.weight": init.norm(f"{a}.q_a_layernorm.weight", shape.q_lora_rank),
        f"{a}.q_b_proj.weight": init.linear(f"{a}.q_b_proj.weight", nh * q_head, shape.q_lora_rank),
        f"{a}.kv_a_proj_with_mqa.weight": init.linear(
            f"{a}.kv_a_proj_with_mqa.weight", shape.kv_lora_rank + shape.qk_rope_head_dim, h
        ),
        f"{a}.kv_a_layernorm.weight": init.norm(f"{a}.kv_a_layernorm.weight", shape.kv_lora_rank),
        f"{a}.kv_b_proj.weight": init.linear(
            f"{a}.kv_b_proj.weight", nh * (shape.qk_nope_head_dim + shape.v_head_dim), shape.kv_lora_rank
        ),
        f"{a}.o_proj.weight": init.linear(f"{a}.o_proj.weight", h, nh * shape.v_head_dim, gain=out_gain),
    }
    m = f"{prefix}.mlp"

    def mlp(p: str, inter: int) -> Tensors:
        return {
            f"{p}.gate_proj.weight": init.linear(f"{p}.gate_proj.weight", inter, h),
            f"{p}.up_proj.weight": init.linear(f"{p}.up_proj.weight", inter, h),
            f"{p}.down_proj.weight": init.linear(f"{p}.down_proj.weight", h, inter, gain=out_gain),
        }

    if not moe:
        tensors.update(mlp(m, shape.intermediate_size))
        return tensors
    tensors[f"{m}.gate.weight"] = init.linear(f"{m}.gate.weight", shape.n_routed_experts, h)
    tensors[f"{m}.gate.e_score_correction_bias"] = np.zeros((shape.n_routed_experts,), dtype=np.float32)
    for e in range(shape.n_routed_experts):
        tensors.update(mlp(f"{m}.experts.{e}", shape.moe_intermediate_size))
    tensors.update(mlp(f"{m}.shared_experts", shape.moe_intermediate_size * shape.n_shared_experts))
    return tensors


def deepseek_v3_weights(shape: DeepseekV3Shape, init: Init) -> Tensors:
    """Main model plus the MTP ("nextn") layers stored as ``model.layers.{num_hidden_layers + j}``."""
    h = shape.hidden_size
    embed = init.embedding("model.embed_tokens.weight", VOCAB_SIZE, h)
    lm_head = init.linear("lm_head.weight", VOCAB_SIZE, h)
    tensors: Tensors = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": init.norm("model.norm.weight", h),
        "lm_head.weight": lm_head,
    }
    for i in range(shape.num_hidden_layers):
        tensors.update(
            deepseek_v3_layer(init, f"model.layers.{i}", shape, moe=i >= shape.first_k_dense_replace)
        )
    for j in range(shape.num_nextn_predict_layers):
        p = f"model.layers.{shape.num_hidden_layers + j}"
        tensors.update(deepseek_v3_layer(init, p, shape, moe=True))
        tensors.update(
            {
                # Real checkpoints carry copies of the shared embedding and head in every MTP layer.
                f"{p}.embed_tokens.weight": embed.copy(),
                f"{p}.shared_head.head.weight": lm_head.copy(),
                f"{p}.enorm.weight": init.norm(f"{p}.enorm.weight", h),
                f"{p}.hnorm.weight": init.norm(f"{p}.hnorm.weight", h),
                f"{p}.eh_proj.weight": init.linear(f"{p}.eh_proj.weight", h, 2 * h),
                f"{p}.shared_head.norm.weight": init.norm(f"{p}.shared_head.norm.weight", h),
            }
        )
    return tensors
