"""kernel-injection patches (stock vs patched, CPU; the Triton kernel itself runs in scripts/device/)."""

from __future__ import annotations

from sglang_support import UnitCases


def test_splitk_fp8_gemm(units: UnitCases) -> None:
    """0007: the torch reference of the split-K kernel's math matches the stock block-FP8 math (upstream quant
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
    """0007 on SM100 + DeepGEMM with a checkpoint whose scales are not UE8M0: upstream's requant_weight_ue8m0 (run
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
    """0007's Triton kernels themselves (not the torch reference) under TRITON_INTERPRET=1, from an exact copy of
    the module (the interpreter's bf16 tl.dot and its truncating fp32 -> bf16 store are moved out of its way): bit-equal
    to the torch reference and within one bf16 ulp of float64 for 5 shapes (K and N tails) x 1/2/5 splits, without
    and with a bias."""
    _, patched = units.case("splitk_triton_interp")
    new = patched["new"]
    assert new is not None and new["replaced"] == {
        ".to(tl.bfloat16)": 2,
        ".to(out_ptr.dtype.element_ty)": 2,
        "out = torch.empty((m, n), dtype=input.dtype,": 1,
        "return out.reshape(*input.shape[:-1], n)": 1,
    }, new["replaced"]
    assert len(new["cases"]) == 30
    for c in new["cases"]:
        assert c["equal_torch_ref"] and c["max_err_in_bf16_ulps"] <= 1.0, c


def test_splitk_never_launches_more_than_the_stock_linear(units: UnitCases) -> None:
    """0007's mechanism, counted on one small-M call (M 3, N 256, K 640): the stock dispatched Triton linear launches
    the per-token-group quant and the block GEMM (+ the bias add_); the split-K kernel stores the output itself at one
    split and adds one reduce+cast kernel at more, bias folded in. The first version launched the kernel, then
    partial.sum and .to (3; 5 with a bias): this test fails on it."""
    stock, patched = units.case("splitk_launches")
    assert patched["ref"] == stock["ref"] and stock["new"] is None
    base = stock["ref"]
    assert base["no_bias"] == ["triton:_per_token_group_quant_8bit", "triton:_w8a8_block_fp8_matmul"]
    assert base["bias"] == [*base["no_bias"], "add_"]
    new = patched["new"]
    kernel, reduce = "triton:_splitk_w8a8_block_fp8_kernel", "triton:_splitk_reduce_kernel"
    for bias in ("no_bias", "bias"):
        assert new[f"splits1_{bias}"] == [kernel], new
        for splits in (2, 5):
            assert new[f"splits{splits}_{bias}"] == [kernel, reduce], new
        assert len(new[f"splits1_{bias}"]) < len(base[bias])
    assert len(new["splits2_bias"]) < len(base["bias"])
