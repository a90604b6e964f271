"""Probe: memory after load + quantize (what ``mlx_lm.convert -q`` does), with or without MLX_LM_FUSED_PROJ=1.

Payload: {"model": folder, "env": {...}, "bits": 4, "group_size": 64}. Loads lazily as convert does, quantizes with
``quantize_model``, evaluates the parameters, collects garbage, then measures. Result: {"param_bytes": bytes of
the model's parameters, "active_memory": mx.get_active_memory(), "fused_groups": concatenations still attached,
"fused_bytes": bytes they hold, "logits": first logits row of a 4-token forward}.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from probe_io import emit, env_override, read_payload

if __name__ == "__main__":
    payload = read_payload()
    with env_override(payload.get("env", {})):
        from mlx_lm.utils import load_model, quantize_model

        model, config = load_model(Path(payload["model"]), lazy=True)
        with contextlib.redirect_stdout(sys.stderr):  # it prints the bits per weight
            model, config = quantize_model(
                model, config, payload.get("group_size", 64), payload.get("bits", 4)
            )
        mx.eval(model.parameters())
        gc.collect()
        mx.clear_cache()
        params = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        groups = fused = 0
        for m in model.modules():
            for f in m.__dict__.get("_fused_projections", {}).values():
                groups += 1
                fused += sum(a.nbytes for a in f.arrays.values())
        active = mx.get_active_memory()
        logits = model(mx.array([[5, 9, 13, 17]]))[0, -1]
        emit(
            {
                "param_bytes": params,
                "active_memory": active,
                "fused_groups": groups,
                "fused_bytes": fused,
                "logits": logits.tolist(),
            }
        )
