"""mtp patches: acceptance characterisation (stock vs patched, CPU)."""

from __future__ import annotations

from typing import Any

import pytest
from sglang_support import UnitCases, engine_results, regime_stats, tokens

from overlay.check.envs import Arms

CHI2_P_1E3 = {15: 37.70}  # chi-square critical value at p = 1e-3

# long: both tests read the engine runs behind engine_results (~2.5 minutes on 2 cores; scripts/test_long.sh)
pytestmark = pytest.mark.long


def test_cpu_sampling_verify(units: UnitCases, arms: Arms) -> None:
    """0009: torch renorms keep the stock pytorch sampler's top-k/top-p sets (its real function; dyadic rows put a
    cumulative mass exactly at top_p, where the sampler keeps the token: `<=`, not `<`); the torch tree sampler never
    accepts a draft without target mass and commits first tokens distributed as the target (chi-square,
    8,100 verifies); and the patched CPU engine verifies sampled requests with it (numerics class: lossless)."""
    stock, patched = units.case("cpu_sampling_verify")
    assert patched["ref"] == stock["ref"] and stock["new"] is None
    new = patched["new"]
    assert new["mask_k"] == stock["ref"]["mask_k"]
    assert new["mask_p"] == stock["ref"]["mask_p"]
    assert new["never_accepts_zero_mass"]
    assert new["chi2"] < CHI2_P_1E3[new["dof"]], new
    _, patched_runs = engine_results(arms)
    sampled = patched_runs["sampled"]["outputs"][1]
    assert len(sampled["output_ids"]) > 0
    assert sampled["meta_info"]["spec_verify_ct"] > 0


def test_acceptance_stats_by_regime(units: UnitCases, arms: Arms) -> None:
    """0010: bucketing and snapshot arithmetic; in the engine, the per-regime histograms equal the sum of the
    per-request histograms of the same requests, split by temperature bucket and workload label, and the greedy
    tokens stay identical to stock."""
    stock_unit, patched_unit = units.case("accept_stats")
    assert stock_unit["new"] is None
    new = patched_unit["new"]
    assert new["buckets"] == {
        "0.0": "greedy",
        "0.3": "(0,0.5]",
        "0.5": "(0,0.5]",
        "0.7": "(0.5,0.9]",
        "1.0": "(0.9,1.1]",
        "1.5": ">1.1",
        "topk1": "greedy",
    }
    chat = next(r for r in new["snapshot"] if r["workload"] == "chat")
    assert chat["correct_drafts_histogram"] == [1, 1, 0, 2]
    assert chat["mean_accept_length"] == 2.75 and chat["accept_rate_by_position"] == [0.75, 0.5, 0.5]
    assert new["labels"] == ["default", "x" * 32]

    stock_runs, patched_runs = engine_results(arms)
    assert tokens(patched_runs["standalone"]) == tokens(stock_runs["standalone"])
    assert regime_stats(stock_runs["standalone"]) == [], "stock must not publish the statistics"

    def summed(outputs: list[dict[str, Any]]) -> list[int]:
        width = max(len(o["meta_info"]["spec_correct_drafts_histogram"]) for o in outputs)
        total = [0] * width
        for o in outputs:
            for i, n in enumerate(o["meta_info"]["spec_correct_drafts_histogram"]):
                total[i] += n
        return total

    rows = regime_stats(patched_runs["standalone"])
    assert [(r["temperature_bucket"], r["workload"]) for r in rows] == [("greedy", "default")]
    assert rows[0]["correct_drafts_histogram"] == summed(patched_runs["standalone"]["outputs"])

    by_regime = {(r["temperature_bucket"], r["workload"]): r for r in regime_stats(patched_runs["sampled"])}
    assert set(by_regime) == {("greedy", "code"), ("(0.5,0.9]", "chat")}
    code, chat_out = patched_runs["sampled"]["outputs"]
    assert by_regime[("greedy", "code")]["correct_drafts_histogram"] == summed([code])
    assert by_regime[("(0.5,0.9]", "chat")]["correct_drafts_histogram"] == summed([chat_out])
