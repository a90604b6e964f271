"""Probe: run the real Generator constructor with a tiny synthetic target and DFlash2 drafter, report how far it got.

On CPU the constructor ends at its first pinned-memory allocation (after the draft-cache checks), so "reached
pinned allocation" means every draft-cache check passed.

payload: {"draft_layer_types": [...], "target_tokens": int, "draft_tokens": int}, or {"cases": [payload, ...]}
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from _common import run_cases, tiny_dflash2, tiny_llama


def case(payload: dict[str, Any]) -> dict[str, Any]:
    from exllamav3 import Cache, Config, Generator, Model
    from exllamav3.cache import CacheLayer_fp16

    with tempfile.TemporaryDirectory() as tmp:
        target = Model.from_config(Config.from_directory(str(tiny_llama(Path(tmp) / "t"))))
        draft = Model.from_config(
            Config.from_directory(
                str(
                    tiny_dflash2(
                        Path(tmp) / "d",
                        layer_types=payload["draft_layer_types"],
                        layers=len(payload["draft_layer_types"]),
                    )
                )
            )
        )
        cache = Cache(target, max_num_tokens=payload["target_tokens"], layer_type=CacheLayer_fp16)
        draft_cache = Cache(draft, max_num_tokens=payload["draft_tokens"], layer_type=CacheLayer_fp16)
        try:
            Generator(target, cache, None, draft_model=draft, draft_cache=draft_cache)
            outcome, message = "constructed", ""
        except AssertionError as e:
            outcome, message = "assertion", str(e)
        except RuntimeError as e:
            outcome, message = (
                ("reached pinned allocation" if "pin_memory" in str(e) else "runtime error"),
                str(e),
            )
        return {"outcome": outcome, "message": message[:200], "draft_paged_layers": draft_cache.num_layers}


if __name__ == "__main__":
    run_cases(case)
