"""Probe: model_init with -mtp (and --mtp_dir) on a tiny synthetic GLM-4-MoE-lite model whose MTP tensors live in a
separate directory (as when a converter dropped the head). Model.load/warmup are no-ops (CUDA-only).

Reports where each MTP/trunk tensor key resolves (model dir or MTP dir) and what init() refused.

payload: {"argv": [...], "mtp_layers": int, "embedded": bool, "whole": bool}; "embedded" puts the MTP tensors in
the model directory itself (the unconverted layout, for the stock reference); "whole" makes the MTP directory a
whole checkpoint (trunk tensors next to the head's, as the original model is). Or {"cases": [payload, ...]}.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from _common import run_cases, write_model


def tiny_glm(directory: Path, mtp_layers: int, with_mtp_tensors: bool) -> Path:
    import torch

    config = {
        "architectures": ["Glm4MoeLiteForCausalLM"],
        "hidden_size": 128,
        "num_attention_heads": 4,
        "q_lora_rank": 64,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "num_hidden_layers": 2,
        "hidden_act": "silu",
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "rms_norm_eps": 1e-5,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "num_nextn_predict_layers": mtp_layers,
        "torch_dtype": "bfloat16",
    }
    tensors = {
        "model.embed_tokens.weight": torch.zeros(512, 128).half(),
        "lm_head.weight": torch.zeros(512, 128).half(),
    }
    if with_mtp_tensors:
        tensors["model.layers.2.eh_proj.weight"] = torch.ones(128, 256).half()
        tensors["model.layers.2.enorm.weight"] = torch.ones(128).half()
    return write_model(directory, config, tensors)


def case(payload: dict[str, Any]) -> dict[str, Any]:
    import argparse

    import torch
    from exllamav3 import Model, model_init

    Model.load = lambda self, *a, **k: None
    Model.warmup = lambda self, *a, **k: []
    with tempfile.TemporaryDirectory() as tmp:
        target = tiny_glm(
            Path(tmp) / "converted",
            payload.get("mtp_layers", 1),
            with_mtp_tensors=bool(payload.get("embedded")),
        )
        mtp = Path(tmp) / "mtp"
        from safetensors.torch import save_file

        mtp.mkdir()
        head = {
            "model.layers.2.eh_proj.weight": torch.ones(128, 256).half(),
            "model.layers.2.enorm.weight": torch.ones(128).half(),
        }
        if payload.get("whole"):
            head.update(
                {
                    "model.embed_tokens.weight": torch.ones(512, 128).half(),
                    "lm_head.weight": torch.ones(512, 128).half(),
                    "model.layers.0.mlp.gate_proj.weight": torch.ones(256, 128).half(),
                    "model.norm.weight": torch.ones(128).half(),
                }
            )
        save_file(head, str(mtp / "mtp.safetensors"))
        argv = [a.replace("{mtp}", str(mtp)) for a in payload.get("argv", [])]
        parser = argparse.ArgumentParser(exit_on_error=False)
        model_init.add_args(parser, add_draft_model_args=True)
        try:
            args = parser.parse_args(["-m", str(target), "-cs", "1024", *argv])
        except (argparse.ArgumentError, SystemExit) as e:
            return {"error": f"argparse: {e}"}
        try:
            out = model_init.init(args, load_tokenizer=False, quiet=True, progress=False)
        except (ValueError, AssertionError) as e:
            return {"error": str(e)}
        config, draft_model = out[1], out[4]
        stc = config.stc
        where = {}
        for key in (
            "model.layers.2.eh_proj.weight",
            "model.layers.2.enorm.weight",
            "model.embed_tokens.weight",
            "model.layers.2.hnorm.weight",
            "lm_head.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.norm.weight",
        ):
            found = stc.find_stc(key) if hasattr(stc, "find_stc") else stc
            has = bool(stc.has_tensor(key))
            where[key] = {"has": has, "dir": "mtp" if Path(found.directory) == mtp else "model"}
        return {
            "where": where,
            "draft": type(draft_model).__name__ if draft_model is not None else None,
            "variant": type(stc).__name__,
            "refused": getattr(config, "tensor_overlay_refused", None),
        }


if __name__ == "__main__":
    run_cases(case)
