"""kernel-injection patches (stock vs patched, CPU; the Triton kernel itself runs in scripts/device/)."""

from __future__ import annotations

from sglang_support import UnitCases


def test_splitk_fp8_gemm(units: UnitCases) -> None:
    """0008: the torch reference of the split-K kernel's math matches the stock block-FP8 math (upstream quant
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


def test_splitk_router_keeps_packed_ue8m0_scales_on_the_default_linear(units: UnitCases) -> None:
    """0008 on SM100 + DeepGEMM with a checkpoint whose scales are not UE8M0: upstream's requant_weight_ue8m0 (run
    for real) turns the block scales into packed int32 UE8M0 words. The dispatcher's router must leave those, and any
    scale tensor not shaped [cdiv(N,128), cdiv(K,128)] fp32, to the default linear (which unpacks them); it takes
    the fp32 block scales of the same weight."""
    stock, patched = units.case("splitk_ue8m0_scales")
    assert stock["new"] is None and patched["ref"] == stock["ref"]
    assert stock["ref"]["scale_dtype"] == "torch.int32", stock["ref"]
    new = patched["new"]
    assert new["routed"], "the flag must wrap the dispatched linear"
    packed = new["int32_packed"]
    assert packed.get("default_calls") == ["torch.int32"], packed
    assert packed["out"] == stock["ref"]["out"], "int32 scales: output differs from the stock linear's"
    assert new["fp32_unpacked"]["default_calls"] == [], "fp32 block scales must reach the split-K kernel"
    assert new["fp32_unpacked"]["max_err_in_bf16_ulps"] <= 1.0
    assert new["fp32_wrong_shape"]["default_calls"] == ["torch.float32"], new["fp32_wrong_shape"]


def test_splitk_triton_kernel_in_the_interpreter(units: UnitCases) -> None:
    """0008's Triton kernel itself (not its torch reference) under TRITON_INTERPRET=1, from an exact-dot copy of its
    source (the interpreter's bf16 tl.dot is wrong; E4M3 operands are exact in fp32): bit-equal to the torch
    reference and within one bf16 ulp of float64 for 5 shapes (K and N tails included) x 1/2/5 splits."""
    _, patched = units.case("splitk_triton_interp")
    new = patched["new"]
    assert new is not None and new["bf16_casts_replaced"] == 2, new
    assert len(new["cases"]) == 15
    for c in new["cases"]:
        assert c["equal_torch_ref"] and c["max_err_in_bf16_ulps"] <= 1.0, c
