"""sampling-fusion patches: sampler and spec-verify sampling (stock vs patched, CPU)."""

from __future__ import annotations

from sglang_support import UnitCases, assert_noop_and_exact

CHI2_P_1E4 = {5: 25.74}  # chi-square critical values at p = 1e-4, by degrees of freedom


def test_fused_temperature_softmax(units: UnitCases) -> None:
    """0003: softmax(logits, temperatures) equals the stock div_ + softmax on the CPU path, and upstream's fused
    Triton kernel (interpreter) is within 1e-5 relative of it (numerics class: approximate, on CUDA)."""
    stock, patched = units.case("temperature_softmax")
    assert patched["ref"] == stock["ref"]
    assert patched["api_equal_stock"], "flag on, CPU path: not bit-equal to the stock sampler path"
    assert patched["splits"] > 1, "the kernel must run its split-row path"
    assert patched["kernel_max_rel_err"] < 1e-5
    assert patched["kernel_argmax_equal"]
    assert all(abs(s - 1.0) < 1e-5 for s in patched["kernel_row_sums"])


def test_packed_verify_broadcast(units: UnitCases) -> None:
    """0004: two gloo ranks with different verify outputs end with rank 0's tensors, bit-equal between the
    stock three broadcasts and the packed one."""
    stock, patched = units.case("packed_broadcast")
    assert stock["ref"]["rank0"] == stock["ref"]["rank1"]
    assert_noop_and_exact(stock, patched)


def test_gumbel_topk_topp_sampling(units: UnitCases) -> None:
    """0005: the exponential-race draw after top-k/top-p has the filtered distribution (chi-square, 200k draws),
    never leaves the support, and top_k=1 is the argmax (numerics class: lossless)."""
    stock, patched = units.case("gumbel_topk_topp")
    assert patched["ref"] == stock["ref"] and stock["new"] is None
    for result in (stock["ref"], patched["new"]):
        assert result["outside_support"] == 0
        assert result["chi2"] < CHI2_P_1E4[result["dof"]], result
        assert result["greedy_ok"]
