"""allreduce-fusion patches (stock vs patched, CPU; the fused kernels need several GPUs, see scripts/device/)."""

from __future__ import annotations

import pytest
from sglang_support import UnitCases


@pytest.mark.long  # ~3.5 minutes on 2 cores (the arms and the reference run): scripts/test_long.sh
def test_ar_norm_group_quant_reference(units: UnitCases) -> None:
    """0008: the reference of the fused AR + residual + RMSNorm + group-quant math gives the stock
    RMSNorm.forward_native outputs on the all-reduced sum, FP8 values within E4M3 precision of them,
    power-of-two scales covering each group, and packed scales in the layout the stock DeepGEMM validator takes."""
    stock, patched = units.case("fused_norm_quant")
    assert patched["ref"] == stock["ref"] and stock["new"] is None
    new = patched["new"]
    assert new["norm"] == stock["ref"]["norm"]
    assert new["residual"] == stock["ref"]["residual"]
    # half an E4M3 step at the top binade (16 of 448 units) with a scale up to 2x the minimal one
    assert new["dequant_max_rel_err"] <= 32 / 448
    assert new["scales_pow2"] and new["scales_cover_max"]
    assert new["packed_exponents_ok"] and new["deepgemm_layout_ok"]
