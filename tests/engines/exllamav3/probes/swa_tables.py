"""Probe: per-forward decode prep of every sliding layer of a 3-layer drafter; count H2D uploads.

payload: {"seed": int, "steps": int, "ring": bool, "static": bool, "share": bool, "reuse": bool}; "static" sets
EXL3_OVL_SWA_RING_STATIC=1 (persistent step tables); "share" passes the forward's
params (the patched signature); stock is called without it. "reuse" passes one params dict to every forward (a
caller that reuses it), instead of a fresh dict per forward as Model.forward's callers in the generator do.
"""

from __future__ import annotations

import os
import random
from typing import Any

from _common import emit, read_payload

PAYLOAD = read_payload()
if PAYLOAD.get("ring"):
    os.environ["EXL3_OVL_SWA_RING"] = "1"
if PAYLOAD.get("static"):
    os.environ["EXL3_OVL_SWA_RING_STATIC"] = "1"  # persistent ring step tables (patched)


def main() -> None:
    import tempfile
    from pathlib import Path

    import torch
    from _common import tiny_dflash2
    from exllamav3 import Cache, Config, Model
    from exllamav3.cache.recurrent_util import advance_recurrent_states
    from exllamav3.modules import sliding_attn

    uploads = 0
    real_h2d = sliding_attn.host_to_device

    def counting_h2d(t: Any, device: Any) -> Any:
        nonlocal uploads
        uploads += 1
        return real_h2d(t, device)

    sliding_attn.host_to_device = counting_h2d
    rnd = random.Random(PAYLOAD["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        directory = tiny_dflash2(
            Path(tmp) / "d",
            layers=3,
            layer_types=["sliding_attention"] * 3,
            window=256,
            hidden=64,
            kv_heads=2,
            head_dim=16,
        )
        model = Model.from_config(Config.from_directory(str(directory)))
        cache = Cache(model, max_num_tokens=256, max_batch_size=2)
        for layer in model.attn_modules:
            layer.device = torch.device("cpu")
        for state_layer in cache.recurrent_layers.values():
            state_layer.alloc("cpu")
        states = [cache.get_new_state(), cache.get_new_state()]
        steps = []
        reused: dict[str, Any] = {}
        for _ in range(PAYLOAD.get("steps", 200)):
            n = rnd.randint(1, 8)
            params: dict[str, Any] = reused if PAYLOAD.get("reuse") else {}
            per_layer = []
            for layer in model.attn_modules:
                k_states, v_states = cache.get_recurrent_layer((layer.layer_idx, 0)).get_state_tensors()
                if PAYLOAD.get("share"):
                    bt, seqlens = layer._decode_state_prep(states, k_states, v_states, n, params)
                else:
                    bt, seqlens = layer._decode_state_prep(states, k_states, v_states, n)
                per_layer.append([bt.tolist(), seqlens.tolist()])
            steps.append(
                {
                    "seqlens": per_layer[0][1],
                    "tables": per_layer[0][0],
                    "same_across_layers": all(x == per_layer[0] for x in per_layer),
                    "wshift": [rs.wshift for rs in states],
                }
            )
            advance_recurrent_states(torch.zeros(2, n), {"recurrent_states": states}, model)
        emit({"steps": steps, "uploads": uploads, "num_steps": len(steps)})


if __name__ == "__main__":
    main()
