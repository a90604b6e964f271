"""Speculative decoding with hybrid (linear-attention, ArraysCache) targets and drafters: stock vs patched.

Target: a tiny Qwen3.5 (gated-delta + full-attention layers, fixed-seed random fp32 weights, probes/spec_build.py).
Stock refuses it (its cache is not trimmable). The patches rewind the gated-delta state either from the states the
layers recorded per verified token (Qwen3.5 / Qwen3-Next on the ops path) or, generically, by restoring a snapshot
taken before the verify and replaying the accepted tokens (folded into the next verify), and rewind a hybrid drafter
with per-step snapshots. The check: on three prompts x 64 tokens, every drafter (itself, a noisy copy, an unrelated
random model) and k in {2, 4} gives exactly the tokens of stock serial greedy decoding, with either rollback
(numerics lossless); and restoring a drafter snapshot gives the state of a drafter that never saw the rejected
tokens, bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_spec_stats import RUN, spec_prompts

from overlay.check.envs import Arms

TOKENS = 64
STATE_TOL = 1e-5
DRAFTS = ("hybrid", "hybrid-noisy", "hybrid-random")


@pytest.fixture(scope="module")
def runs(arms: Arms, models: dict[str, str]) -> dict[str, Any]:
    prompts = spec_prompts(1)
    cases: list[dict[str, Any]] = [
        {
            "id": "serial",
            "api": "serial",
            "target": models["hybrid"],
            "max_tokens": TOKENS,
            "prompts": prompts,
        }
    ]
    for draft in DRAFTS:
        for k in (2, 4):
            cases.append(
                {
                    "id": f"{draft}/k{k}",
                    "api": "spec",
                    "target": models["hybrid"],
                    "draft": models[draft],
                    "k": k,
                    "max_tokens": TOKENS,
                    "prompts": prompts,
                    "stats": True,
                }
            )
            # The same with the generic rollback: restore the snapshot, replay the accepted tokens (folded into
            # the next verify), as for hybrid layers that record no per-token states.
            cases.append(
                {
                    "id": f"{draft}/k{k}/replay",
                    "api": "spec",
                    "target": models["hybrid"],
                    "draft": models[draft],
                    "k": k,
                    "max_tokens": TOKENS,
                    "prompts": prompts,
                    "no_step_capture": True,
                }
            )
    cases.append(
        {"id": "rollback", "api": "rollback_unit", "target": models["hybrid-noisy"], "prompts": prompts}
    )
    cases.append({"id": "capture", "api": "capture_unit", "target": models["hybrid"], "prompts": prompts})
    return {arm.name: arm.run_json(RUN, {"cases": cases})["cases"] for arm in (arms.stock, arms.patched)}


def test_hybrid_speculative_matches_serial(runs: dict[str, Any]) -> None:
    stock, patched = runs["stock"], runs["patched"]
    serial = [r["tokens"] for r in stock["serial"]["runs"]]
    assert [r["tokens"] for r in patched["serial"]["runs"]] == serial
    rates = {}
    for draft in DRAFTS:
        for k in (2, 4):
            case = f"{draft}/k{k}"
            assert "trimmable" in stock[case].get("error", ""), f"stock should refuse {case}: {stock[case]}"
            assert "error" not in patched[case], patched[case]
            for i, run in enumerate(patched[case]["runs"]):
                assert run["tokens"] == serial[i], f"{case} prompt {i}"
            for i, run in enumerate(patched[f"{case}/replay"]["runs"]):
                assert run["tokens"] == serial[i], f"{case}/replay prompt {i}"
            rates[case] = sum(r["stats"]["accepted"] for r in patched[case]["runs"]) / sum(
                r["stats"]["drafted"] for r in patched[case]["runs"]
            )
    assert rates["hybrid/k2"] == rates["hybrid/k4"] == 1.0
    assert 0.1 < rates["hybrid-noisy/k2"] < 1.0, rates  # partial acceptance: rollbacks happen
    assert rates["hybrid-random/k2"] < 0.2, rates


def test_hybrid_drafter_snapshot_restores_state(runs: dict[str, Any]) -> None:
    result = runs["patched"]["rollback"]
    assert "error" not in result, result
    for run in result["runs"]:
        assert run["max_abs_diff"] == 0.0, run
        assert run["restored_offset"] == run["reference_offset"]
    assert "error" in runs["stock"]["rollback"]  # no snapshot API in stock


def test_recorded_gated_delta_states_roll_back(runs: dict[str, Any]) -> None:
    """The states a 4-token update recorded, rolled back to its first t tokens, equal those of an update with only
    those t tokens (fp32; the projections of 4 rows vs t rows may differ in the last bits)."""
    result = runs["patched"]["capture"]
    assert "error" not in result, result
    for run in result["runs"]:
        for t, entry in run.items():
            assert entry["recorded"], (t, entry)
            assert entry["max_abs_diff"] <= STATE_TOL, (t, entry)
    assert "error" in runs["stock"]["capture"]
