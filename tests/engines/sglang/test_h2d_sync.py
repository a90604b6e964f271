"""h2d-sync patches: host/device copies on the per-step speculative-decoding path (stock vs patched, CPU)."""

from __future__ import annotations

from sglang_support import UnitCases, assert_noop_and_exact


def test_pinned_decode_lens_staging(units: UnitCases) -> None:
    """0001: the pinned-ring staging gives the same int32 device lengths as the two stock copies, across ring
    wraps and regrowth, and earlier results are not overwritten by later stagings."""
    stock, patched = units.case("pinned_lens")
    assert_noop_and_exact(stock, patched)


def test_pp_tail_host_seq_lens(units: UnitCases) -> None:
    """0002: the host mirror is the stock one unless the flag is on and no draft backend needs it."""
    stock, patched = units.case("pp_tail")
    assert patched["ref"] == stock["ref"]
    assert stock["new"] is None
    new = patched["new"]
    for key in ("flag0_needs1", "flag0_needs0", "flag1_needs1"):
        assert new[key] == stock["ref"], key
    assert new["flag1_needs0"] is None


def test_stream_ordered_seq_lens_gate(units: UnitCases) -> None:
    """0017: flag off, the overlap scheduler's gate equals the stock expression on the full truth table; flag on,
    CUDA also resolves GPU-only seq lens stream-ordered (no confidence relay, no host lengths)."""
    stock, patched = units.case("stream_ordered_gate")
    assert patched["ref"] == stock["ref"] and stock["new"] is None
    new = patched["new"]
    assert new["0"] == stock["ref"]
    changed = {k for k in stock["ref"] if new["1"][k] != stock["ref"][k]}
    assert changed == {"FalseFalseFalse"}
