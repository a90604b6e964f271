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


def test_future_map_resolve_waits_on_the_host_once_per_step(units: UnitCases) -> None:
    """S1, measured (no patch: docs/engines/sglang.md, "S1"): the wheel's own FutureMap, publish then
    resolve_seq_lens_cpu as the overlap scheduler calls them before each spec decode step. In its CUDA layout (pinned
    mirror, private D2H stream) a backend that needs host lengths costs one host wait per resolve, the
    fwd_prepare_d2h_stream.synchronize(), after an async copy of the whole relay buffer; needs_cpu_seq_lens=False
    skips both. The series changes neither (patched equals stock)."""
    stock, patched = units.case("future_map_resolve")
    assert patched["ref"] == stock["ref"]
    ref = stock["ref"]
    cuda = ref["cuda_needs1"]
    assert cuda["pinned_mirror"] and cuda["d2h_stream"]
    assert cuda["host_syncs_per_resolve"] == 1.0
    assert cuda["kinds"]["host-syncs:Stream.synchronize"] == 3  # 3 resolves
    ((site, n),) = cuda["sites"]
    assert site.startswith("sglang/srt/managers/overlap_utils.py:") and n == 3
    assert (
        cuda["bytes_moved_per_resolve"] == 8 * 8
    )  # int64 x the 8-slot request pool, not only the batch's rows
    assert [r["seq_lens_cpu"] for r in cuda["resolved"]] == [[100, 40], [101, 42], [102, 44]]
    assert [r["seq_lens_sum"] for r in cuda["resolved"]] == [140, 143, 146]
    for layout in ("cuda_needs0", "bootstrap_needs0"):
        assert ref[layout]["host_syncs_per_resolve"] == 0.0, layout
        assert all(r["seq_lens_cpu"] is None for r in ref[layout]["resolved"])
    boot = ref["bootstrap_needs1"]  # non-CUDA: a blocking .cpu() of the batch's lengths
    assert boot["host_syncs_per_resolve"] == 1.0 and boot["kinds"]["host-syncs:Tensor.cpu"] == 3
