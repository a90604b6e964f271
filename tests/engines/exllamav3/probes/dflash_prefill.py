"""Probe: DFlash-family K/V update from target hidden states (dflash_update_kv_from_target) over prefill chunks.

The drafter's fc / hidden_norm / k_proj / v_proj / RoPE are CUDA-backed; here they are torch stand-ins (fixed
random matrices, an RMS norm, and a rotation whose angle depends on the absolute position the real code hands
to RoPE, so a wrong position offset shows). The ring planning and writing code is the real one. After every
chunk the probe reports each layer's visible window (last sliding_window + 1 positions) as digests, the state
positions, and how many target rows went through the projections.

payload: {"seed": int, "chunks": [int, ...], "draft_window": int|null, "layer_types": [...], "window": int,
          "env": {"EXL3_OVL_DFLASH_PREFILL_CROP": "1", "EXL3_OVL_SWA_RING": "1"}}, or {"cases": [payload, ...]}
"""

from __future__ import annotations

import hashlib
from typing import Any

from _common import run_cases


def case(PAYLOAD: dict[str, Any]) -> dict[str, Any]:
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    import torch
    from _common import tiny_dflash2
    from exllamav3 import Cache, Config, Model
    from exllamav3.modules import sliding_attn

    hidden, kvh, hd = 64, 2, 16
    gen = torch.Generator().manual_seed(PAYLOAD["seed"])
    projected = {"fc_rows": 0, "kv_rows": 0}

    def linear(w: Any) -> Any:
        def forward(x: Any, params: Any, out_dtype: Any = None) -> Any:
            key = "fc_rows" if w.shape[0] == 2 * hidden else "kv_rows"
            projected[key] += x.shape[0] * x.shape[1]
            return (x.float() @ w).half()

        return SimpleNamespace(forward=forward)

    def rms(x: Any, params: Any, out_dtype: Any = None) -> Any:
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).half()

    def rope_apply(k: Any, q: Any, position: Any, positions: Any, position_ids: Any, *args: Any) -> Any:
        # rotate channel pairs by an angle that depends on the absolute position of each row
        bsz, n = k.shape[:2]
        pos = positions.view(bsz, 1).float() + torch.arange(n).view(1, n).float()
        ang = (pos * 0.01).view(bsz, n, 1, 1)
        a, b = k[..., 0::2].float(), k[..., 1::2].float()
        out = torch.empty_like(k)
        out[..., 0::2] = (a * torch.cos(ang) - b * torch.sin(ang)).half()
        out[..., 1::2] = (a * torch.sin(ang) + b * torch.cos(ang)).half()
        return out, None

    with tempfile.TemporaryDirectory() as tmp:
        types = PAYLOAD.get("layer_types", ["sliding_attention"] * 2)
        directory = tiny_dflash2(
            Path(tmp) / "d",
            layers=len(types),
            layer_types=types,
            window=PAYLOAD.get("window", 256),
            hidden=hidden,
            kv_heads=kvh,
            head_dim=hd,
        )
        kwargs = {"draft_window": PAYLOAD["draft_window"]} if PAYLOAD.get("draft_window") else {}
        model = Model.from_config(Config.from_directory(str(directory)), **kwargs)
        cache = Cache(model, max_num_tokens=256, max_batch_size=2)
        model.input_layer.device = torch.device("cpu")
        model.input_layer.proj = linear(torch.randn(2 * hidden, hidden, generator=gen) / 8)
        model.input_layer.norm = SimpleNamespace(forward=rms)
        for layer in model.attn_modules:
            layer.device = torch.device("cpu")
            layer.k_proj = linear(torch.randn(hidden, kvh * hd, generator=gen) / 8)
            layer.v_proj = linear(torch.randn(hidden, kvh * hd, generator=gen) / 8)
            layer.rope = SimpleNamespace(apply=rope_apply)
            layer.k_norm_tensor, layer.norm_eps, layer.norm_constant_bias = None, 1e-6, 0.0
        for state_layer in cache.recurrent_layers.values():
            state_layer.alloc("cpu")
        rs = cache.get_new_state()

        def window_digest(layer: Any) -> str:
            k_states, v_states = cache.get_recurrent_layer((layer.layer_idx, 0)).get_state_tensors()
            n = min(layer.sliding_window + 1, rs.position - rs.window_beg)
            t0 = rs.position - n
            if getattr(layer, "ring", False):
                k = sliding_attn.ring_read(k_states, rs.slot, t0, n)
                v = sliding_attn.ring_read(v_states, rs.slot, t0, n)
            else:
                k = k_states[rs.slot, t0 - rs.window_beg : rs.position - rs.window_beg]
                v = v_states[rs.slot, t0 - rs.window_beg : rs.position - rs.window_beg]
            return hashlib.sha256(
                k.contiguous().numpy().tobytes() + v.contiguous().numpy().tobytes()
            ).hexdigest()[:16]

        after = []
        for n in PAYLOAD["chunks"]:
            taps = [torch.randn(1, n, hidden, generator=gen).half() for _ in range(2)]
            params = {
                "block_table": None,
                "cache_seqlens": torch.tensor([rs.position], dtype=torch.int32),
                "recurrent_states": [rs],
            }
            model.update_kv_from_target(taps, cache, params)
            after.append(
                {
                    "position": rs.position,
                    "window_beg": rs.window_beg,
                    "windows": [window_digest(layer) for layer in model.attn_modules],
                }
            )
        return {
            "after": after,
            "projected": projected,
            "kv_state_size": [layer.kv_state_size for layer in model.attn_modules],
        }


if __name__ == "__main__":
    run_cases(case)
