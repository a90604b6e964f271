"""Probe: write tiny HF-format checkpoints with MTP weights, one per model family (run in the stock arm).

Payload: {"out": folder, "families": [name, ...] (default: all), "seed": int}.
Result: {"models": {family: {"dir", "style": "qwen" | "nextn", "first": first nextn layer index (nextn style),
"experts": routed experts of an MTP layer (0: dense), "mla": bool, "mtp_raw": [names of the MTP tensors]}}}.

The models go to ``out/mtp-families-<key>/<family>``, key = hash of this probe's source, the families, the seed and
the mlx / mlx-lm versions: a later call with the same inputs returns the cached folder (built in a scratch folder
and renamed into place, under a file lock, so parallel or interrupted runs never see half a model).

Each model is a stock mlx-lm model with fixed-seed random fp32 weights (norm weights jittered so that norm handling
matters), written back in the Hugging Face layout the family's ``sanitize`` expects (per-expert or fused experts,
``kv_b_proj``, zero-centred Qwen norms, ``(C, 1, K)`` conv1d, VLM prefixes), plus an MTP head named like the real
checkpoints: Qwen style ``mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0.*, norm}`` (the layer copies
the full-attention main layer, perturbed), DeepSeek style ``model.layers.{N}.{enorm, hnorm, eh_proj,
shared_head.norm, embed_tokens, shared_head.head}`` plus a decoder layer copying the last (MoE) main layer,
perturbed. Stock mlx-lm loads every one of them strictly (it drops the MTP weights). A tiny word-level tokenizer is
written too, so ``mlx_lm.load`` and ``mlx_lm.convert`` work.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from build_once import build_once
from mlx.utils import tree_flatten
from probe_io import emit, log, read_payload

VOCAB = 128
H = 64

_MOE = {
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 32,
    "routed_scaling_factor": 2.5,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": True,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "moe_layer_freq": 1,
}
_MLA = {"kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 8, "qk_nope_head_dim": 8}
_COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": H,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "num_nextn_predict_layers": 1,
}
_DSA = {"index_head_dim": 16, "index_n_heads": 2, "index_topk": 4}
_QWEN_LINEAR = {
    "linear_num_value_heads": 2,
    "linear_num_key_heads": 1,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
}

CONFIGS: dict[str, dict[str, Any]] = {
    # deepseek_v3's stock sanitize drops `model.layers.61` (hard-coded), so its tiny model has 61 layers.
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        **_COMMON,
        **_MOE,
        **_MLA,
        "num_hidden_layers": 61,
        "first_k_dense_replace": 59,
        "rope_scaling": None,
    },
    "deepseek_v32": {
        "model_type": "deepseek_v32",
        **_COMMON,
        **_MOE,
        **_MLA,
        **_DSA,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "rope_scaling": None,
    },
    "glm_moe_dsa": {
        "model_type": "glm_moe_dsa",
        **_COMMON,
        **_MOE,
        **_MLA,
        **_DSA,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "glm4_moe": {
        "model_type": "glm4_moe",
        **_COMMON,
        **_MOE,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "head_dim": 16,
        "use_qk_norm": True,
        "partial_rotary_factor": 0.5,
        "rope_scaling": None,
    },
    "glm4_moe_lite": {
        "model_type": "glm4_moe_lite",
        **_COMMON,
        **_MOE,
        **_MLA,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "rope_scaling": None,
    },
    "qwen3_next": {
        "model_type": "qwen3_next",
        **_COMMON,
        **_QWEN_LINEAR,
        "num_hidden_layers": 4,
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 32,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "partial_rotary_factor": 0.5,
        "norm_topk_prob": True,
        "rope_scaling": None,
        "mtp_num_hidden_layers": 1,
    },
    "qwen3_5": {
        "model_type": "qwen3_5",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "text_config": {
            "model_type": "qwen3_5_text",
            **_COMMON,
            **_QWEN_LINEAR,
            "num_hidden_layers": 4,
            "head_dim": 16,
            "mtp_num_hidden_layers": 1,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [2, 1, 1],
            },
        },
    },
    "qwen3_5_moe": {
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            **_COMMON,
            **_QWEN_LINEAR,
            "num_hidden_layers": 4,
            "head_dim": 16,
            "mtp_num_hidden_layers": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "shared_expert_intermediate_size": 32,
            "moe_intermediate_size": 32,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [2, 1, 1],
            },
        },
    },
}
QWEN = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
MLA = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe_lite")
QWEN_SHIFTED = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def _noise(shape: tuple[int, ...], scale: float) -> mx.array:
    return mx.random.normal(shape) * scale


def _mlx_params(family: str, config: dict[str, Any]) -> dict[str, mx.array]:
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    for name, value in params.items():  # jitter norms so that the +1 shift and norm loading are observable
        if value.ndim == 1 and name.endswith("norm.weight"):
            params[name] = value + _noise(value.shape, 0.1)
    return params


def _unstack_experts(params: dict[str, mx.array], fused: bool) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for name, value in params.items():
        if ".switch_mlp." not in name:
            out[name] = value
            continue
        prefix, proj = name.split(".switch_mlp.")
        proj = proj.split(".")[0]
        if fused:
            if proj == "gate_proj":
                up = params[name.replace("gate_proj", "up_proj")]
                out[f"{prefix}.experts.gate_up_proj"] = mx.concatenate([value, up], axis=-2)
            elif proj == "down_proj":
                out[f"{prefix}.experts.down_proj"] = value
            continue
        for e in range(value.shape[0]):
            out[f"{prefix}.experts.{e}.{proj}.weight"] = value[e]
    return out


def _merge_kv_b(params: dict[str, mx.array]) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for name, value in params.items():
        if name.endswith(".unembed_out.weight"):
            continue
        if name.endswith(".embed_q.weight"):
            wv = params[name.replace("embed_q", "unembed_out")]
            kv = mx.concatenate([value.swapaxes(-1, -2), wv], axis=1)  # (heads, nope + v, kv_lora)
            out[name.replace("embed_q", "kv_b_proj")] = kv.reshape(-1, kv.shape[-1])
            continue
        out[name] = value
    return out


def _to_hf(family: str, params: dict[str, mx.array]) -> dict[str, mx.array]:
    params = _unstack_experts(params, fused=family == "qwen3_5_moe")
    if family in MLA:
        params = _merge_kv_b(params)
    if family not in QWEN:
        return params
    out: dict[str, mx.array] = {}
    for name, value in params.items():
        if name.endswith("conv1d.weight"):
            value = value.moveaxis(2, 1)  # mlx (C, K, 1) -> HF (C, 1, K)
        if value.ndim == 1 and name.endswith(QWEN_SHIFTED):
            value = value - 1.0  # stored zero-centred
        if family != "qwen3_next":
            if name.startswith("language_model.model."):
                name = "model.language_model." + name[len("language_model.model.") :]
            elif name.startswith("language_model."):
                name = name[len("language_model.") :]
        out[name] = value
    return out


def _qwen_mtp(hf: dict[str, mx.array], family: str) -> dict[str, mx.array]:
    base = "model.layers.3." if family == "qwen3_next" else "model.language_model.layers.3."
    mtp = {
        f"mtp.layers.0.{k[len(base) :]}": v + _noise(v.shape, 0.02)
        for k, v in hf.items()
        if k.startswith(base)
    }
    mtp["mtp.fc.weight"] = _noise((H, 2 * H), (2 * H) ** -0.5)
    for norm in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        mtp[norm] = _noise((H,), 0.1)  # zero-centred, like the main norms
    return mtp


def _nextn_mtp(hf: dict[str, mx.array], first: int) -> dict[str, mx.array]:
    base = f"model.layers.{first - 1}."
    p = f"model.layers.{first}."
    mtp = {p + k[len(base) :]: v + _noise(v.shape, 0.02) for k, v in hf.items() if k.startswith(base)}
    mtp[p + "enorm.weight"] = 1.0 + _noise((H,), 0.1)
    mtp[p + "hnorm.weight"] = 1.0 + _noise((H,), 0.1)
    mtp[p + "eh_proj.weight"] = _noise((H, 2 * H), (2 * H) ** -0.5)
    mtp[p + "shared_head.norm.weight"] = 1.0 + _noise((H,), 0.1)
    mtp[p + "embed_tokens.weight"] = mx.array(hf["model.embed_tokens.weight"])  # copies, as real checkpoints
    mtp[p + "shared_head.head.weight"] = mx.array(hf["lm_head.weight"])
    return mtp


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 512,
            }
        )
    )


def build(family: str, out: Path, seed: int) -> dict[str, Any]:
    config = json.loads(json.dumps(CONFIGS[family]))
    mx.random.seed(seed)
    hf = _to_hf(family, _mlx_params(family, config))
    text = config.get("text_config", config)
    first = int(text["num_hidden_layers"])
    mtp = _qwen_mtp(hf, family) if family in QWEN else _nextn_mtp(hf, first)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), {**hf, **mtp}, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**config, "bos_token_id": 1, "eos_token_id": 2}, indent=1))
    write_tokenizer(out)
    experts = 0 if family == "qwen3_5" else int(text.get("num_experts") or text.get("n_routed_experts") or 0)
    return {
        "dir": str(out),
        "style": "qwen" if family in QWEN else "nextn",
        "first": first,
        "experts": experts,
        "mla": family in MLA,
        "mtp_raw": sorted(mtp),
    }


def cached_build(out: Path, families: list[str], seed: int) -> dict[str, Any]:
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("mtp_build.py", "mtp_common.py"):
        h.update((here / name).read_bytes())
    h.update(
        json.dumps(
            [families, seed, importlib.metadata.version("mlx"), importlib.metadata.version("mlx-lm")]
        ).encode()
    )
    name = f"mtp-families-{h.hexdigest()[:12]}"

    def make(scratch: Path) -> None:
        models = {}
        for i, family in enumerate(families):
            log(f"mtp_build: {family}")
            models[family] = build(family, scratch / family, seed + i)
            models[family]["dir"] = str(out / name / family)
        (scratch / "models.json").write_text(json.dumps(models, indent=1, sort_keys=True))

    final = build_once(out, name, make)
    models_json: dict[str, Any] = json.loads((final / "models.json").read_text())
    return models_json


def main() -> None:
    payload = read_payload()
    families = payload.get("families") or list(CONFIGS)
    emit({"models": cached_build(Path(payload["out"]), families, int(payload.get("seed", 0)))})


if __name__ == "__main__":
    main()
