"""lm-head patches (stock vs patched, CPU)."""

from __future__ import annotations

from sglang_support import UnitCases


def test_single_lm_head_quant_predicate(units: UnitCases) -> None:
    """0010: dropping the shadowed definition changes no answer of should_apply_lm_head_quant_method on a matrix
    of lm_heads x quant methods, and leaves exactly one definition."""
    stock, patched = units.case("lm_head_quant_predicate")
    assert patched["ref"] == stock["ref"]
    assert stock["definitions"] == 2
    assert patched["definitions"] == 1


def test_fp8_lm_head(units: UnitCases) -> None:
    """0011: FP8 lm_head on the tiny llama's real lm_head weight: E4M3 weight error bound, logits close to the
    stock lm_head path, high top-1 agreement, one shared copy per tensor, loaded weight untouched
    (numerics class: approximate)."""
    stock, patched = units.case("fp8_lm_head")
    assert patched["ref"] == stock["ref"] and stock["new"] is None
    new = patched["new"]
    assert new["real_weight"], "the probe must use the tiny model's lm_head weight"
    assert new["shape"] == stock["ref"]["shape"] and new["dtype"] == stock["ref"]["dtype"]
    assert new["weight_err_rel_row_max"] <= 16 / 448 + 1e-6
    assert new["logit_err_rel_span"] < 0.05
    assert new["top1_agreement"] >= 0.9
    assert new["shared_copy"] and new["weight_unchanged"]
