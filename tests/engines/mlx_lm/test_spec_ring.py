"""A bounded, rewindable drafter cache (DraftRingKVCache, --draft-max-kv-size): stock vs patched.

Target: a tiny context-sensitive Qwen3 with a full KV cache; drafter: a noisy copy of it (probes/spec_build.py).
Stock can bound the drafter only with a RotatingKVCache, which silently stops rewinding once it wraps: the drafter
keeps rejected tokens and its positions run ahead of the target. The patched ring keeps ``window + slack`` slots and
stays trimmable. Checks (numerics lossless: the target decides every token):

- tokens equal stock serial greedy decoding for windows 8, 16 and 64, in both arms' configurations;
- the ring drafter stays aligned with the target (offset within 2 tokens, where stock's rotating drafter drifts),
  holds at most ``window + slack`` slots, and is accepted at least as often as stock's rotating drafter;
- the ring itself: under random writes and trims, its logits equal those of serial decoding of the kept tokens with
  ``RotatingKVCache(window)`` (max |diff| <= 1e-4, fp32);
- ``draft_max_kv_size`` through ``stream_generate`` gives the serial tokens too.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_spec_stats import RUN, spec_prompts

from overlay.check.envs import Arms

TOKENS = 64
WINDOWS = (8, 16, 64)
SLACK = 4
LOGITS_TOL = 1e-4


@pytest.fixture(scope="module")
def runs(arms: Arms, models: dict[str, str]) -> dict[str, Any]:
    prompts = spec_prompts(4)
    base = {
        "target": models["qwen3"],
        "draft": models["qwen3-noisy"],
        "k": 3,
        "max_tokens": TOKENS,
        "prompts": prompts,
    }
    cases: list[dict[str, Any]] = [
        {
            "id": "serial",
            "api": "serial",
            "target": models["qwen3"],
            "max_tokens": TOKENS,
            "prompts": prompts,
        },
        {"id": "stream-ring", "api": "stream", "kwargs": {"draft_max_kv_size": 16}, **base},
        {
            "id": "unit",
            "api": "ring_unit",
            "target": models["qwen3-noisy"],
            "window": 8,
            "slack": SLACK,
            "prompts": prompts[:2],
        },
    ]
    for w in WINDOWS:
        cases.append(
            {"id": f"ring{w}", "api": "spec", "cache": {"draft": "ring", "window": w, "slack": SLACK}, **base}
        )
        cases.append(
            {"id": f"rotating{w}", "api": "spec", "cache": {"draft": "rotating", "window": w}, **base}
        )
    return {arm.name: arm.run_json(RUN, {"cases": cases})["cases"] for arm in (arms.stock, arms.patched)}


def test_ring_drafter_matches_serial_and_stays_aligned(runs: dict[str, Any]) -> None:
    stock, patched = runs["stock"], runs["patched"]
    serial = [r["tokens"] for r in stock["serial"]["runs"]]
    assert "DraftRingKVCache" in stock["ring8"]["error"]
    drifted = 0
    for w in WINDOWS:
        ring, rot = patched[f"ring{w}"], stock[f"rotating{w}"]
        assert "error" not in ring and "error" not in rot, (ring, rot)
        for i, (r, s) in enumerate(zip(ring["runs"], rot["runs"])):
            assert r["tokens"] == serial[i] and s["tokens"] == serial[i], f"window {w} prompt {i}"
            off = r["offsets"]
            assert 0 <= off["target"] - off["draft"] <= 2, (w, i, off)
            assert r["draft_slots"] <= w + SLACK, (w, i, r["draft_slots"])
            drifted += s["offsets"]["draft"] - s["offsets"]["target"] > 2
        ring_accepted = sum(sum(r["from_draft"]) for r in ring["runs"])
        rot_accepted = sum(sum(r["from_draft"]) for r in rot["runs"])
        assert ring_accepted >= rot_accepted, (w, ring_accepted, rot_accepted)
    assert drifted > 0, "stock's rotating drafter should drift past the target once it wraps"
    for i, r in enumerate(patched["stream-ring"]["runs"]):
        assert r["tokens"] == serial[i]


def test_ring_cache_equals_sliding_window_decoding(runs: dict[str, Any]) -> None:
    unit = runs["patched"]["unit"]
    assert "error" not in unit, unit
    for run in unit["runs"]:
        assert run["checks"] > 20
        assert run["max_abs_diff"] <= LOGITS_TOL, run
        assert run["slots"] <= 8 + SLACK
