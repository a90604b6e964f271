"""``max_kv_size`` with a draft model: stock drops it silently, the patched series honours it exactly.

Stock ``stream_generate`` pops ``max_kv_size`` when a draft model is given, so the user's bound is ignored: the
tokens are those of *unbounded* serial decoding. The patched series (spec-window-target patch) builds the target's
``RotatingKVCache`` as serial decoding does, verifies and rewinds it exactly, and bounds the drafter to the same
window (a DraftRingKVCache): the tokens must be those of serial decoding with the same ``max_kv_size``. This replaces
the earlier plain refusal of the flag (patch "refuse max_kv_size with a draft model", superseded).
"""

from __future__ import annotations

from typing import Any

from test_spec_stats import RUN, spec_prompts

from overlay.check.envs import Arms

TOKENS = 64
WINDOW = 16


def test_max_kv_size_with_draft_matches_serial(arms: Arms, models: dict[str, str]) -> None:
    prompts = spec_prompts(3)
    base = {"target": models["qwen3"], "max_tokens": TOKENS, "prompts": prompts}
    cases: list[dict[str, Any]] = [
        {"id": "serial", "api": "serial", **base},
        {"id": "serial-bounded", "api": "serial", "kwargs": {"max_kv_size": WINDOW}, **base},
        {
            "id": "spec-bounded",
            "api": "stream",
            "draft": models["qwen3-noisy"],
            "k": 3,
            "kwargs": {"max_kv_size": WINDOW},
            **base,
        },
        {
            "id": "spec-bounded-adaptive",
            "api": "stream",
            "draft": models["qwen3-noisy"],
            "k": 3,
            "kwargs": {"max_kv_size": WINDOW, "adaptive_draft": True},
            **base,
        },
    ]
    stock = arms.stock.run_json(RUN, {"cases": cases})["cases"]
    patched = arms.patched.run_json(RUN, {"cases": cases})["cases"]
    unbounded = [r["tokens"] for r in stock["serial"]["runs"]]
    bounded = [r["tokens"] for r in stock["serial-bounded"]["runs"]]
    assert unbounded != bounded, "the model must be sensitive to the window for this check to mean anything"

    # Stock: the bound is silently dropped (tokens of unbounded decoding).
    assert [r["tokens"] for r in stock["spec-bounded"]["runs"]] == unbounded
    # Patched: honoured, exactly as serial decoding with the same bound.
    assert [r["tokens"] for r in patched["spec-bounded"]["runs"]] == bounded
    assert [r["tokens"] for r in patched["spec-bounded-adaptive"]["runs"]] == bounded
    assert all(r["stats"]["cycles"] > 0 for r in patched["spec-bounded"]["runs"])
