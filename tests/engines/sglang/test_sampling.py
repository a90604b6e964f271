"""sampling-fusion patches: sampler and spec-verify sampling (stock vs patched, CPU)."""

from __future__ import annotations

from sglang_support import UnitCases, assert_noop_and_exact

CHI2_P_1E4 = {5: 25.74}  # chi-square critical values at p = 1e-4, by degrees of freedom


def test_packed_verify_broadcast(units: UnitCases) -> None:
    """0003: two gloo ranks with different verify outputs end with rank 0's tensors, bit-equal between the
    stock three broadcasts and the packed one."""
    stock, patched = units.case("packed_broadcast")
    assert stock["ref"]["rank0"] == stock["ref"]["rank1"]
    assert_noop_and_exact(stock, patched)


def test_gumbel_topk_topp_sampling(units: UnitCases) -> None:
    """0004: the exponential-race draw after top-k/top-p has the filtered distribution (chi-square, 200k draws),
    never leaves the support, and top_k=1 is the argmax (numerics class: lossless)."""
    stock, patched = units.case("gumbel_topk_topp")
    assert patched["ref"] == stock["ref"] and stock["new"] is None
    for result in (stock["ref"], patched["new"]):
        assert result["outside_support"] == 0
        assert result["chi2"] < CHI2_P_1E4[result["dof"]], result
        assert result["greedy_ok"]
