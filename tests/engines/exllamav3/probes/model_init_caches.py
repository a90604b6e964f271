"""Probe: model_init.add_args + init() on a tiny synthetic Llama target and DFlash2 drafter; describe the caches.

Model.load and Model.warmup need the CUDA extension; they are replaced by no-ops here (test infrastructure),
everything else in init() (argument handling, model and cache construction) is the real code.

payload: {"argv": [...extra args...], "layer_types": [...]}, or {"cases": [payload, ...]} (each with optional "env")
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from _common import run_cases, tiny_dflash2, tiny_llama


def describe(cache: Any) -> dict[str, Any]:
    if cache is None:
        return {}
    layers = list(cache.layers.values())
    return {
        "max_num_tokens": cache.max_num_tokens,
        "types": sorted({type(l).__name__ for l in layers}),
        "bits": sorted({(getattr(l, "k_bits", 16), getattr(l, "v_bits", 16)) for l in layers}),
        "compand_a": sorted({float(getattr(l, "compand_a", 0.0)) for l in layers}),
        "paged_bytes": int(sum(int(l.storage_size()) for l in layers)),
        "ring_bytes": int(sum(int(l.storage_size()) for l in cache.recurrent_layers.values())),
        "ring_types": sorted({type(l).__name__ for l in cache.recurrent_layers.values()}),
        "attached": sum(1 for m in cache.model.get_cache_layers() for l in m.cache_layers if l in layers),
    }


def case(payload: dict[str, Any]) -> dict[str, Any]:
    import argparse

    from exllamav3 import Model, model_init

    Model.load = lambda self, *a, **k: None
    Model.warmup = lambda self, *a, **k: []
    with tempfile.TemporaryDirectory() as tmp:
        target = tiny_llama(Path(tmp) / "t")
        draft = tiny_dflash2(Path(tmp) / "d", layer_types=payload.get("layer_types", ["full_attention"] * 3))
        parser = argparse.ArgumentParser(exit_on_error=False)
        model_init.add_args(parser, add_draft_model_args=True)
        try:
            args = parser.parse_args(
                ["-m", str(target), "-dm", str(draft), "-cs", "8192", *payload.get("argv", [])]
            )
        except (argparse.ArgumentError, SystemExit) as e:
            return {"error": f"argparse: {e}"}
        try:
            _, _, cache, _, draft_model, _, draft_cache = model_init.init(
                args, load_tokenizer=False, quiet=True, progress=False
            )
        except ValueError as e:
            return {"error": str(e)}
        return {
            "cache": describe(cache),
            "draft_cache": describe(draft_cache),
            "draft_modules": [type(m).__name__ for m in draft_model.attn_modules],
            "draft_cache_refs": len(draft_model.cache_weakrefs),
        }


if __name__ == "__main__":
    run_cases(case)
