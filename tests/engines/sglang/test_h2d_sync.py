"""h2d-sync patches: host/device copies on the per-step speculative-decoding path (stock vs patched, CPU)."""

from __future__ import annotations

from sglang_support import UnitCases


def test_pp_tail_host_seq_lens(units: UnitCases) -> None:
    """0002: the host mirror is the stock one unless the flag is on and no draft backend needs it."""
    stock, patched = units.case("pp_tail")
    assert patched["ref"] == stock["ref"]
    assert stock["new"] is None
    new = patched["new"]
    for key in ("flag0_needs1", "flag0_needs0", "flag1_needs1"):
        assert new[key] == stock["ref"], key
    assert new["flag1_needs0"] is None
