"""Probe: which requests ``mlx_lm.server`` would batch, and what batched generation gives, for one model.

Payload: {"model": folder, "args": [server arguments after --model DIR], "env": {...}, "prompts": [text, ...],
"max_tokens": n}. The server's own ``main`` parses the arguments; ``run`` is replaced so nothing listens; the
ModelProvider it built loads the model as the server would. For a request with each ``draft_kind`` ("model",
"mtp") the probe asks the server's ``ResponseGenerator._is_batchable`` (the check its generation loop uses), then
runs the prompts through ``batch_generate`` (the continuous-batching engine) on the loaded model.
Result: {"has_mtp", "provider_batchable", "batchable": {draft_kind: bool}, "batch_texts": [text, ...]}.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace
from typing import Any

from probe_io import emit, read_payload

if __name__ == "__main__":
    payload = read_payload()
    os.environ.update(payload.get("env", {}))
    server: Any = importlib.import_module("mlx_lm.server")
    gen: Any = importlib.import_module("mlx_lm.generate")
    captured: dict[str, Any] = {}
    server.run = lambda host, port, provider, *a, **k: captured.setdefault("provider", provider)
    sys.argv = ["mlx_lm.server", "--model", payload["model"], *payload.get("args", [])]
    server.main()
    provider = captured["provider"]
    provider.load_default()
    try:
        from mlx_lm.models.mtp import has_mtp

        mtp = bool(has_mtp(provider.model))
    except ImportError:
        mtp = False
    fake = SimpleNamespace(model_provider=provider, cli_args=provider.cli_args)
    batchable = {
        kind: bool(server.ResponseGenerator._is_batchable(fake, SimpleNamespace(seed=None, draft_kind=kind)))
        for kind in ("model", "mtp")
    }
    prompts = [provider.tokenizer.encode(text) for text in payload["prompts"]]
    out = gen.batch_generate(
        provider.model, provider.tokenizer, prompts, max_tokens=payload["max_tokens"], verbose=False
    )
    emit(
        {
            "has_mtp": mtp,
            "provider_batchable": bool(provider.is_batchable),
            "batchable": batchable,
            "batch_texts": out.texts,
        }
    )
