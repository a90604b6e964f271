"""TEST INFRASTRUCTURE (overlay SGLang CPU harness): an SGLang plugin for the DeepSeek NextN draft on the CPU engine.

SGLang 0.5.23's ``DeepseekV2ForCausalLM.set_embed_and_head`` (how the NEXTN draft takes the target's embedding and
lm_head) ends with ``torch.cuda.synchronize()`` unconditionally; on a CPU build of torch that raises ``AssertionError:
Torch not compiled with CUDA enabled`` while the draft worker allocates its memory pool, so the CPU engine cannot
start NEXTN on a DeepSeek-V3 checkpoint at all. This plugin wraps that one method (SGLang's own plugin hooks, an
AROUND hook registered from the ``sglang.srt.plugins`` entry point) so that, only when torch has no CUDA, the
synchronize inside it is a no-op (there is no device to wait for). Nothing else changes.

With ``OVERLAY_SGLANG_DRAFT_REPORT=FILE`` the hook also writes, once, what it served (JSON): the draft model's class,
its NextN decoder layer's class, the sum of its ``eh_proj`` weight and whether its embedding and lm_head are the
target's tensors, so a test can tell that the draft is the checkpoint's real NextN layer.

Put this folder on ``PYTHONPATH`` of an arm to enable it (its ``.dist-info`` makes the entry point visible to
``importlib.metadata``; SGLang's ``load_plugins()`` runs it in the engine, scheduler and detokenizer processes).
Never shipped inside a patched wheel.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

TARGET = "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.set_embed_and_head"


def _report(model: Any, embed: Any, head: Any) -> None:
    path = os.environ.get("OVERLAY_SGLANG_DRAFT_REPORT")
    if not path:
        return
    inner = getattr(model, "model", None)
    eh_proj = getattr(inner, "eh_proj", None)
    report = {
        "class": type(model).__name__,
        "decoder": type(getattr(inner, "decoder", None)).__name__,
        "eh_proj_sum": float(eh_proj.weight.double().sum()) if eh_proj is not None else None,
        "shares_embed": model.model.embed_tokens.weight is embed,
        "shares_head": model.lm_head.weight is head,
    }
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh)


def _without_cuda_sync(original: Callable[..., Any], model: Any, embed: Any, head: Any) -> Any:
    import torch

    if torch.cuda.is_available():
        result = original(model, embed, head)
    else:
        saved = torch.cuda.synchronize
        torch.cuda.synchronize = lambda device=None: None
        try:
            result = original(model, embed, head)
        finally:
            torch.cuda.synchronize = saved
    _report(model, embed, head)
    return result


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _without_cuda_sync, HookType.AROUND)
