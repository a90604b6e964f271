"""kernel-injection patches (stock vs patched, CPU; the Triton kernel itself runs in scripts/device/)."""

from __future__ import annotations

from sglang_support import UnitCases


def test_splitk_fp8_gemm(units: UnitCases) -> None:
    """0012: the torch reference of the split-K kernel's math matches the stock block-FP8 math (upstream quant
    formula, float64 GEMM) within one bf16 ulp for every split count; the router sends small-M calls to the
    registered kernel and the rest to the default linear; both backends are in SGLang's kernel registry."""
    stock, patched = units.case("splitk_fp8_gemm")
    assert patched["ref"] == stock["ref"] and stock["new"] is None
    new = patched["new"]
    for splits, result in new["splits"].items():
        assert result["dtype"] == "torch.bfloat16"
        assert result["max_err_in_bf16_ulps"] <= 1.0, (splits, result)
    assert new["router_calls"] == ["default"], "only the 32-row call may reach the default linear"
    assert new["router_small_equal_torch_ref"]
    assert new["registered"] == [
        "sglang.kernels.ops.gemm.splitk_fp8:splitk_w8a8_block_fp8_linear",
        "sglang.kernels.ops.gemm.splitk_fp8:splitk_w8a8_block_fp8_linear_torch",
    ]
