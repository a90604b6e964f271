"""Probe: build a tiny synthetic DFlash/DFlash2 drafter (+ its Cache, meta-allocated) and describe it.

payload: {"arch": "dflash2"|"dflash", "layer_types": [...], "window": int, "draft_window": int|null,
          "cache_tokens": int, "swa_full": bool, "alloc_device": "cuda"|null}
With alloc_device (GPU check) the cache tensors are really allocated there and the allocator delta reported.
Or {"cases": [payload, ...]}.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from _common import run_cases, tiny_dflash, tiny_dflash2


def case(payload: dict[str, Any]) -> dict[str, Any]:
    from exllamav3 import Cache, Config, Model
    from exllamav3.cache import CacheLayer_fp16

    with tempfile.TemporaryDirectory() as tmp:
        make = tiny_dflash2 if payload.get("arch", "dflash2") == "dflash2" else tiny_dflash
        directory = make(
            Path(tmp) / "draft",
            layer_types=payload["layer_types"],
            window=payload.get("window", 256),
            layers=len(payload["layer_types"]),
        )
        config = Config.from_directory(str(directory))
        kwargs = {"swa_full": bool(payload.get("swa_full", False))}
        if payload.get("draft_window") is not None:
            kwargs["draft_window"] = payload["draft_window"]
        try:
            model = Model.from_config(config, **kwargs)
        except ValueError as e:
            return {"error": str(e)}
        cache = Cache(
            model,
            max_num_tokens=payload.get("cache_tokens", 8192),
            layer_type=CacheLayer_fp16,
            max_batch_size=1,
        )
        allocated = None
        if payload.get("alloc_device"):
            import torch

            device = torch.device(payload["alloc_device"])
            before = torch.cuda.memory_allocated(device)
            for layer in list(cache.layers.values()) + list(cache.recurrent_layers.values()):
                layer.alloc(device)
            allocated = torch.cuda.memory_allocated(device) - before
        return {
            "allocated_bytes": allocated,
            "modules": [type(m).__name__ for m in model.attn_modules],
            "windows": [[m.sliding_window, m.window_right] for m in model.attn_modules],
            "kv_state_size": [getattr(m, "kv_state_size", None) for m in model.attn_modules],
            "caps": {k: v for k, v in model.caps.items() if isinstance(v, (bool, int, str))},
            "paged_bytes": int(sum(int(l.storage_size()) for l in cache.layers.values())),
            "ring_bytes": int(sum(int(l.storage_size()) for l in cache.recurrent_layers.values())),
            "num_layers": cache.num_layers,
        }


if __name__ == "__main__":
    run_cases(case)
