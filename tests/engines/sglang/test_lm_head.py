"""lm-head patches (stock vs patched, CPU)."""

from __future__ import annotations

from sglang_support import UnitCases


def test_single_lm_head_quant_predicate(units: UnitCases) -> None:
    """0005: dropping the shadowed definition changes no answer of should_apply_lm_head_quant_method on a matrix
    of lm_heads x quant methods, and leaves exactly one definition."""
    stock, patched = units.case("lm_head_quant_predicate")
    assert patched["ref"] == stock["ref"]
    assert stock["definitions"] == 2
    assert patched["definitions"] == 1


def test_fp8_lm_head(units: UnitCases) -> None:
    """0006: FP8 lm_head on the tiny llama's real lm_head weight, through the real LogitsProcessor._compute_lm_head
    with the copy prepare_fp8_lm_heads makes at load: E4M3 weight error bound, logits close to the stock lm_head
    path, high top-1 agreement, one shared copy per tensor, loaded weight untouched (numerics class: approximate)."""
    stock, patched = units.case("fp8_lm_head")
    assert patched["ref"] == stock["ref"] and stock["new"] is None
    new = patched["new"]
    assert new["prepared"] == 1, "prepare_fp8_lm_heads must find the CausalLM's lm_head"
    assert new["real_weight"], "the probe must use the tiny model's lm_head weight"
    assert new["shape"] == stock["ref"]["shape"] and new["dtype"] == stock["ref"]["dtype"]
    assert new["weight_err_rel_row_max"] <= 16 / 448 + 1e-6
    assert new["logit_err_rel_span"] < 0.05
    assert new["top1_agreement"] >= 0.9
    assert new["shared_copy"] and new["weight_unchanged"]


def test_fp8_lm_head_lifecycle(units: UnitCases) -> None:
    """0006: the copy is made by ModelRunner.initialize (before the KV cache is sized) a chunk at a time, so the
    load transient is one chunk (not the 6x of the old lazy first-call copy) and the first lm_head call allocates no
    weight-sized copy; a model with fp32 lm_head output gets fp32 logits written into the caller's logits buffer, as
    the stock branch does; an online update through upstream's update_weights_from_tensor re-quantizes the copy in
    the same storage (what a captured graph reads), so eager and graph logits follow the new weight."""
    _, patched = units.case("fp8_lm_head_lifecycle")
    new = patched["new"]
    assert new is not None, "the patched arm lacks prepare_fp8_lm_heads"
    assert new["initialize_prepares"] and not new["initialize_sizes_kv"]
    assert new["kept_over_weight"] <= 0.51, new  # E4M3 copy + fp32 row scales of a bf16 head
    assert new["load_transient_over_weight"] <= 0.26, new  # one 1 MiB fp32 chunk of a 4 MiB head
    assert new["first_call_peak_over_weight"] <= 0.3, new  # was 6.0: the lazy copy at the first call
    assert new["first_call_dtype"] == "torch.bfloat16"
    fp32 = new["fp32_output"]
    assert fp32["dtype"] == "torch.float32" and fp32["into_out_buffer"], fp32
    assert fp32["max_err_rel"] < 0.08, fp32
    upd = new["update"]
    assert upd["ok"] and upd["weight_updated"], upd
    assert upd["same_storage"] and upd["storage_current"] and upd["eager_logits_current"], upd
