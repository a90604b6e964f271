"""The ExLlamaV3 census task (workers/exllamav3_census.py through ExLlamaV3Adapter.run) in the stock and patched arms.

It runs the wheel's own generator round code on CPU with the labelled stand-ins (the extension, the models' forwards,
the generator object); these tests check that it counts in the engine's code (call sites in exllamav3/...), that a
patch's flag moves what it should, and that a flag whose code the CPU path never reaches is reported as not measured
rather than as "unchanged".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from overlay.check.envs import Arm, Arms, arms_for
from overlay.engines import get_adapter
from overlay.errors import ExternalCommandError
from overlay.progress import NullReporter
from overlay.schemas.documents import CensusRequest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.long]  # minutes on 2 cores: scripts/test_long.sh


@pytest.fixture(scope="module")
def arms() -> Arms:
    return arms_for(REPO, "exllamav3")


def census(arm: Arm, scenario: str, env: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    run_arm = arm.with_env(env)
    request = cast(CensusRequest, {"task": "census", "model": "", "scenario": scenario, "steps": 3, **extra})
    return get_adapter("exllamav3").run(run_arm, request)


def test_scenarios_are_declared() -> None:
    assert get_adapter("exllamav3").census_scenarios() == (
        "decode-step",
        "spec-verify-step",
        "draft-round",
        "prefill-chunk",
        "drafter-load",
        "verify-mlp",
    )


def test_stock_verify_step_counts_in_the_generator(arms: Arms) -> None:
    doc = census(arms.stock, "spec-verify-step")
    assert doc["scenario"] == "spec-verify-step" and doc["steps"] == 3
    # bsz 2: one device-wide synchronize per job after sampling (the reviewer's 1 + B waits per round, B of them here)
    assert doc["metrics"]["host-syncs"] == 2.0
    assert all(site.startswith("exllamav3/generator/generator.py:") for site, _ in doc["sites"]["host-syncs"])
    assert doc["metrics"]["eager-launches"] > 0
    assert doc["metrics"]["peak-memory"] is None and "peak-memory: not counted" in " ".join(doc["notes"])
    assert doc["standin"]


def test_readback_flag_removes_verify_syncs(arms: Arms) -> None:
    stock = census(arms.stock, "spec-verify-step")
    off = census(arms.patched, "spec-verify-step")
    on = census(arms.patched, "spec-verify-step", {"EXL3_OVL_VERIFY_READBACK": "1"})
    assert off["metrics"]["host-syncs"] == stock["metrics"]["host-syncs"]  # flag off: stock behaviour
    assert on["metrics"]["host-syncs"] < off["metrics"]["host-syncs"]


def test_round_sync_moves_the_wait_out_of_the_draft_round(arms: Arms) -> None:
    flag = {"EXL3_OVL_ROUND_SYNC": "1"}
    draft_off, draft_on = census(arms.patched, "draft-round"), census(arms.patched, "draft-round", flag)
    verify_off, verify_on = (
        census(arms.patched, "spec-verify-step"),
        census(arms.patched, "spec-verify-step", flag),
    )
    assert draft_on["metrics"]["host-syncs"] < draft_off["metrics"]["host-syncs"]
    # ... into the verify step: per round (draft + verify) the count does not move
    assert (
        draft_on["metrics"]["host-syncs"] + verify_on["metrics"]["host-syncs"]
        == draft_off["metrics"]["host-syncs"] + verify_off["metrics"]["host-syncs"]
    )


def test_a_flag_the_cpu_path_never_reads_is_not_measured(arms: Arms) -> None:
    # a paged drafter has no window rings: the ring switch is never read
    doc = census(arms.patched, "draft-round", {"EXL3_OVL_SWA_RING": "1"}, drafter_layers="paged")
    assert set(doc["metrics"].values()) == {None}
    assert any("EXL3_OVL_SWA_RING set but never read" in n for n in doc["notes"])


def test_variants_are_a_ring_and_a_paged_drafter() -> None:
    from overlay.engines.exllamav3 import ExLlamaV3Adapter

    variants = ExLlamaV3Adapter().census_variants(
        root=REPO,
        arm=None,  # type: ignore[arg-type]
        models=None,
        explicit=False,
        reporter=NullReporter(),
    )
    assert [dict(v.extra).get("drafter_layers", dict(v.extra).get("drafter")) for v in variants] == [
        "ring",
        "paged",
        "mtp",
    ]


def test_embed_on_device_gives_one_sync_per_round(arms: Arms) -> None:
    """The real Embedding placed by the loader's rule: host table, so 0013 alone keeps the waits; with
    --embed_on_device (0016) and the drafter's input layer on 0005's anchor path (its ids uploaded non-blocking), a
    round (draft + verify) has one host sync; stock's input layer uploads the block's ids with a blocking .to()
    (embedding.py:289), one more."""
    flag = {"EXL3_OVL_ROUND_SYNC": "1", "EXL3_OVL_DFLASH_MASK_CACHE": "1"}
    on = {"options": {"--embed_on_device": None}}

    def per_round(arm: Arm, env: dict[str, str] | None = None, **extra: Any) -> float:
        return float(
            sum(
                census(arm, s, env, **extra)["metrics"]["host-syncs"]
                for s in ("draft-round", "spec-verify-step")
            )
        )

    stock, alone, both = (
        per_round(arms.stock),
        per_round(arms.patched, flag),
        per_round(arms.patched, flag, **on),
    )
    assert both == 1.0 and alone == stock > 1.0
    block_ids = per_round(arms.patched, {"EXL3_OVL_ROUND_SYNC": "1"}, **on)
    assert block_ids == 2.0
    doc = census(arms.patched, "draft-round", flag, **on)
    assert "after --embed_on_device" in doc["notes"][0]


def test_ring_step_becomes_capturable(arms: Arms) -> None:
    """The ring drafter's per-layer step (the wheel's _decode_state_prep, judged in a capture-check region): stock
    uploads pageable lengths per layer, the ring alone makes block tables with torch.tensor(device=) when its bases
    move; the persistent tables (0020) are capturable."""
    ring = {"EXL3_OVL_SWA_RING": "1"}
    stock = census(arms.stock, "draft-round")
    alone = census(arms.patched, "draft-round", ring)
    static = census(arms.patched, "draft-round", {**ring, "EXL3_OVL_SWA_RING_STATIC": "1"})
    assert stock["metrics"]["capturable"] is False and alone["metrics"]["capturable"] is False
    assert static["metrics"]["capturable"] is True
    assert (
        static["metrics"]["pageable-copies"]
        < alone["metrics"]["pageable-copies"]
        < stock["metrics"]["pageable-copies"]
    )
    # what pageable copy is left is the drafter's host-table embedding upload, not the ring code
    assert not any("sliding_attn.py" in site for site, _ in static["sites"].get("pageable-copies", []))
    assert any("sliding_attn.py" in site for site, _ in alone["sites"]["pageable-copies"])
    # the ring removes stock's shift copies (launches of the wheel's code in sliding_attn.py)
    assert alone["metrics"]["eager-launches"] < stock["metrics"]["eager-launches"]


def test_ring_drafter_round_capture_needs_the_device_table(arms: Arms) -> None:
    """0021's round graph on a ring drafter whose input is the wheel's DFlashInputLayer: capturable only with the
    table on the device (0016) and 0005's anchor-only input (EXL3_OVL_DFLASH_MASK_CACHE=1), whose anchor ids reach
    the device through Module.prepare_for_device (non-blocking from pinned staging). Stock's input layer builds the
    block's ids on the host and Embedding.forward uploads them with a blocking .to(): a pageable, blocking copy
    inside the round; the first 0005 (anchor through Embedding.forward) left the blocking copy (fails here)."""
    flags = {
        "EXL3_OVL_SWA_RING": "1",
        "EXL3_OVL_SWA_RING_STATIC": "1",
        "EXL3_OVL_DRAFTER_GRAPH": "1",
        "EXL3_OVL_DFLASH_MASK_CACHE": "1",
    }
    host = census(arms.patched, "draft-round", flags)
    device = census(arms.patched, "draft-round", flags, options={"--embed_on_device": None})
    assert device["metrics"]["capturable"] is True, device["detail"]["violations"]
    no_anchor_path = {k: v for k, v in flags.items() if k != "EXL3_OVL_DFLASH_MASK_CACHE"}
    block_ids = census(arms.patched, "draft-round", no_anchor_path, options={"--embed_on_device": None})
    assert block_ids["metrics"]["capturable"] is False
    assert any("embedding.py" in v for v in block_ids["detail"]["violations"]), block_ids["detail"][
        "violations"
    ]
    assert host["metrics"]["capturable"] is False  # the drafter's input layer gathers on the host (F4)
    assert any(
        "spec_round.py" in v or "embedding" in v or "device_copy" in v for v in host["detail"]["violations"]
    )
    # the emulated graph replays the captured round: its launches move from eager to graph launches (the round
    # that captures and the two validated replays still run an eager round too)
    off = census(arms.patched, "draft-round", options={"--embed_on_device": None})
    assert device["metrics"]["graph-launches"] > 0 == off["metrics"]["graph-launches"]
    assert device["metrics"]["eager-launches"] < off["metrics"]["eager-launches"]


def test_cli_options_are_refused(arms: Arms) -> None:
    with pytest.raises(ExternalCommandError, match="model_init/loader switches"):
        census(arms.patched, "draft-round", options={"--draft_window": "512"})


def test_q8_ring_write_back_uploads_once_per_step(arms: Arms) -> None:
    """0008's quantized rings (ring_bits: what --draft_cache_quant 8 makes of a --draft_window drafter's rings with
    EXL3_OVL_SWA_RING=1): the DFlash write-back after verify uploads one table for every row and layer; the previous
    0008 made two pageable uploads per sequence and layer (bsz 2: 13 h2d copies per verify step, bsz 3: 19)."""
    ring = {"EXL3_OVL_SWA_RING": "1"}
    for bsz in (2, 3):
        fp16 = census(arms.patched, "spec-verify-step", ring, bsz=bsz)
        q8 = census(arms.patched, "spec-verify-step", ring, bsz=bsz, ring_bits=[8, 8])
        assert "quantized" in " ".join(q8["notes"])
        # one more upload than the fp16 ring's step (which writes its rows with device slice copies), whatever bsz
        assert q8["metrics"]["h2d-copies"] == fp16["metrics"]["h2d-copies"] + 1
        assert q8["metrics"]["pageable-copies"] == fp16["metrics"]["pageable-copies"] + 1
        assert q8["metrics"]["host-syncs"] == fp16["metrics"]["host-syncs"]
        sites = dict(map(tuple, q8["sites"]["h2d-copies"]))
        assert sites.get("exllamav3/util/device_copy.py:102") == q8["steps"]  # host_to_device, once a step
    # the switches a quantized ring needs are checked: a clear refusal, not a stand-in traceback
    with pytest.raises(ExternalCommandError, match="EXL3_OVL_SWA_RING=1"):
        census(arms.patched, "spec-verify-step", ring_bits=[8, 8])
    with pytest.raises(ExternalCommandError, match="no quantized window ring"):
        census(arms.stock, "spec-verify-step", ring, ring_bits=[8, 8])


def test_ring_write_back_launches_do_not_grow_with_bsz(arms: Arms) -> None:
    """0020 with EXL3_OVL_SWA_RING_STATIC=1: the DFlash write-back after verify (write_state_rows, 3 ring layers)
    writes each layer's block with one index_copy_ per tensor through one index uploaded per step, where the ring
    alone copies k and v per row (the previous 0020 too): 6 launches per step at every bsz instead of 6 per row,
    for one more (non-blocking, pinned) upload; the write-back region stays capturable."""
    ring = {"EXL3_OVL_SWA_RING": "1"}
    static = {**ring, "EXL3_OVL_SWA_RING_STATIC": "1"}

    def write_back(doc: dict[str, Any], metric: str) -> float:
        sites = doc["sites"].get(metric, [])
        return float(sum(n for site, n in sites if "sliding_attn.py" in site)) / float(doc["steps"])

    for bsz in (1, 2, 4):
        copies = census(arms.patched, "spec-verify-step", ring, bsz=bsz)
        indexed = census(arms.patched, "spec-verify-step", static, bsz=bsz)
        assert write_back(copies, "eager-launches") == 6 * bsz
        assert write_back(indexed, "eager-launches") == 6
        saved = copies["metrics"]["eager-launches"] - indexed["metrics"]["eager-launches"]
        assert saved == 6 * (bsz - 1)  # nothing at bsz 1 (the upload is the one op more there)
        assert write_back(indexed, "h2d-copies") == 1 and write_back(copies, "h2d-copies") == 0
        assert indexed["metrics"]["h2d-copies"] == copies["metrics"]["h2d-copies"] + 1
        for metric in ("pageable-copies", "host-syncs"):
            assert indexed["metrics"][metric] == copies["metrics"][metric]
        # the write_state_rows calls run in a capture-check region: no host read, no pageable copy in either
        assert indexed["metrics"]["capturable"] is True and copies["metrics"]["capturable"] is True


def _load(
    arm: Arm, layers: str, env: dict[str, str] | None = None, options: dict[str, str] | None = None
) -> dict[str, Any]:
    return census(arm, "drafter-load", env, drafter_layers=layers, options=options or {})


def test_drafter_load_counts_the_drafters_caches(arms: Arms) -> None:
    """drafter-load: the drafter's caches as the wheel's model_init builds and allocates them (target's apart)."""
    stock, off = _load(arms.stock, "paged"), _load(arms.patched, "paged")
    # a paged fp16 drafter: 3 layers x (k, v) x 65536 tokens x 2 heads x 64 x 2 bytes, at the wheel's alloc()
    assert stock["metrics"]["peak-memory"] == off["metrics"]["peak-memory"] == 3 * 2 * 65536 * 2 * 64 * 2
    assert stock["detail"]["draft_cache"]["paged_types"] == ["CacheLayer_fp16"]
    assert stock["detail"]["target_cache_bytes"] == 2 * 2 * 65536 * 2 * 32 * 2  # counted apart
    assert any(site.startswith("exllamav3/cache/fp16.py:") for site, _ in stock["sites"]["eager-launches"])
    # the stock wheel's model_init does not know the series' options: a clear refusal, not a number
    with pytest.raises(ExternalCommandError, match="refuses"):
        _load(arms.stock, "paged", options={"--draft_window": "512"})


def test_draft_window_and_draft_cache_quant_shrink_the_drafters_caches(arms: Arms) -> None:
    """0001 (--draft_window), 0004 (--draft_cache_quant) and 0008 (Q8 rings): peak-memory decreases in drafter-load."""
    paged_off, ring_off = _load(arms.patched, "paged"), _load(arms.patched, "ring")
    window = _load(arms.patched, "paged", options={"--draft_window": "512"})
    assert window["detail"]["draft_cache"]["ring_types"] == ["SWALayerState"]
    assert window["metrics"]["peak-memory"] < paged_off["metrics"]["peak-memory"] / 50
    # a checkpoint's own sliding layers keep their windows (0001 forces full-attention layers only)
    assert (
        _load(arms.patched, "ring", options={"--draft_window": "512"})["metrics"]["peak-memory"]
        == (ring_off["metrics"]["peak-memory"])
    )
    q8 = _load(arms.patched, "paged", options={"--draft_cache_quant": "8"})
    assert q8["detail"]["draft_cache"]["paged_types"] == ["CacheLayer_quant"]
    assert 0.4 < q8["metrics"]["peak-memory"] / paged_off["metrics"]["peak-memory"] < 0.6
    # rings stay fp16 without the modular ring; with it they are quantized (0008)
    assert (
        _load(arms.patched, "ring", options={"--draft_cache_quant": "8"})["metrics"]["peak-memory"]
        == (ring_off["metrics"]["peak-memory"])
    )
    q8_ring = _load(arms.patched, "ring", {"EXL3_OVL_SWA_RING": "1"}, options={"--draft_cache_quant": "8"})
    assert q8_ring["detail"]["draft_cache"]["ring_types"] == ["SWALayerState_quant"]
    assert q8_ring["metrics"]["peak-memory"] < 0.7 * ring_off["metrics"]["peak-memory"]


def test_drafter_load_ring_only_bytes_do_not_follow_the_cache_size(arms: Arms) -> None:
    """Why the old 0002 (a ring-only draft cache of another size) was dropped: its size costs no device memory."""
    big, small = _load(arms.patched, "ring"), _load(arms.patched, "ring", options={"-cs": "4096"})
    assert big["metrics"]["peak-memory"] == small["metrics"]["peak-memory"] > 0
    paged_big, paged_small = (
        _load(arms.patched, "paged"),
        _load(arms.patched, "paged", options={"-cs": "4096"}),
    )
    assert paged_small["metrics"]["peak-memory"] * 16 == paged_big["metrics"]["peak-memory"]


def test_prefill_crop_shrinks_the_drafter_projections(arms: Arms) -> None:
    """0006 (EXL3_OVL_DFLASH_PREFILL_CROP=1) in the wheel's dflash_update_kv_from_target, prefill chunks of 2048 rows
    into 3 window rings (window 256, kv_state_size 768): only the chunk's last 768 rows go through fc, k_proj and
    v_proj, so the GEMMs' operand bytes shrink; the job's uploads (positions, block table) do not move, so bytes-moved
    is not this patch's mechanism. The windows after every chunk equal stock's (a wrong crop or RoPE offset shows)."""
    crop = {"EXL3_OVL_DFLASH_PREFILL_CROP": "1"}
    stock = census(arms.stock, "prefill-chunk")
    off = census(arms.patched, "prefill-chunk")
    on = census(arms.patched, "prefill-chunk", crop)
    ring = census(arms.patched, "prefill-chunk", {**crop, "EXL3_OVL_SWA_RING": "1"})
    assert on["metrics"]["gemm-bytes"] < off["metrics"]["gemm-bytes"] == stock["metrics"]["gemm-bytes"]
    assert on["metrics"]["bytes-moved"] == off["metrics"]["bytes-moved"] == stock["metrics"]["bytes-moved"]
    chunk, kept = stock["detail"]["chunk"], max(stock["detail"]["kv_state_size"])
    assert chunk > kept  # the crop has rows to drop
    layers = len(stock["detail"]["kv_state_size"])
    for doc, rows in ((stock, chunk), (off, chunk), (on, kept), (ring, kept)):
        # rows through fc once per chunk, through k_proj and v_proj once per layer each
        assert doc["detail"]["per_chunk"] == [{"fc_rows": rows, "kv_rows": 2 * layers * rows}] * doc["steps"]
        assert doc["detail"]["after"] == stock["detail"]["after"]
    # the projections' activation rows are what shrinks: stock - on = the dropped rows' fp16 operand bytes
    # (fc reads 2 taps x hidden per row, each k/v projection hidden per row; weights are read the same)
    hidden = 64
    dropped = (chunk - kept) * 2 * (2 * hidden + 2 * layers * hidden)
    assert stock["metrics"]["gemm-bytes"] - on["metrics"]["gemm-bytes"] == dropped
    assert any("EXL3_OVL_DFLASH_PREFILL_CROP=1" in n for n in on["notes"])
    # a paged drafter layer's prefill write is the extension's kernel: refused, not counted as a ring
    with pytest.raises(ExternalCommandError, match="prefill-chunk needs drafter_layers 'ring'"):
        census(arms.patched, "prefill-chunk", crop, drafter_layers="paged")


def test_fused_tier_keeps_a_16_row_verify_mlp_graphed(arms: Arms) -> None:
    """0015 (EXL3_OVL_BSZN=16) in the wheel's GatedMLP.load_local / forward: a verify forward of 9..16 rows (bsz 2 x
    (K + 1), 16 at K 7) takes the bound class's graphed run_bszN instead of the eager per-linear kernels (fused
    gate/up MGEMM, activation, down GEMM: 3 eager launches); up to 8 rows every arm takes the graph, past 16 every
    arm runs eagerly. The bound class's graph is modelled (a replay counts its 3 kernels as graph-launches)."""
    flag = {"EXL3_OVL_BSZN": "16"}
    for rows in (16, 12, 9):
        stock = census(arms.stock, "verify-mlp", rows=rows)
        off = census(arms.patched, "verify-mlp", rows=rows)
        on = census(arms.patched, "verify-mlp", flag, rows=rows)
        assert stock["metrics"]["eager-launches"] == off["metrics"]["eager-launches"] == 3, rows
        assert on["metrics"]["eager-launches"] == 0 and on["metrics"]["graph-launches"] == 3, rows
        assert off["metrics"]["graph-launches"] == stock["metrics"]["graph-launches"] == 0, rows
        assert (stock["detail"]["route"], off["detail"]["route"], on["detail"]["route"]) == (
            "eager",
            "eager",
            "fused",
        )
        assert on["detail"]["statics"][0] == [2, 16, 128] and off["detail"]["statics"][0] == [2, 8, 128]
        assert on["detail"]["compiled_max_bszn"] == 16 and off["detail"]["compiled_max_bszn"] == 8
        assert any("EXL3_OVL_BSZN=16" in n for n in on["notes"])
        assert any(site.startswith("exllamav3_ext.exl3_mgemm") for site, _ in off["sites"]["eager-launches"])
    for rows in (8, 1):  # the <= 8-row tier: every arm on the graph, the same launches
        docs = [
            census(arms.stock, "verify-mlp", rows=rows),
            census(arms.patched, "verify-mlp", rows=rows),
            census(arms.patched, "verify-mlp", flag, rows=rows),
        ]
        assert {(d["metrics"]["eager-launches"], d["metrics"]["graph-launches"]) for d in docs} == {
            (0.0, 3.0)
        }
        assert {d["detail"]["route"] for d in docs} == {"fused"}
    # past the tier every arm runs eagerly; the separate gate/up configuration graphs 4 kernels
    assert census(arms.patched, "verify-mlp", flag, rows=17)["metrics"]["eager-launches"] == 3
    sep = census(arms.patched, "verify-mlp", flag, rows=16, gate_up="separate")
    assert (sep["metrics"]["eager-launches"], sep["metrics"]["graph-launches"]) == (0, 4)
    # the flag set on a stock wheel is never read: not measured, not "unchanged"
    assert census(arms.stock, "verify-mlp", flag)["metrics"]["eager-launches"] is None


def test_mtp_index_share_drops_the_indexer_at_depths_after_the_first(arms: Arms) -> None:
    """0019 (EXL3_OVL_MTP_INDEX_SHARE=1): in the MTP round, depths >= 1 take mtp_extend_selection instead of the
    layer's indexer (q projection, RoPE, head weights, scoring and top-k per row), on the dispatch path; depth 0 is
    unchanged. Fails without the patch: off == on."""
    for bsz in (1, 2):
        stock = census(arms.stock, "draft-round", drafter="mtp", bsz=bsz)
        off = census(arms.patched, "draft-round", drafter="mtp", bsz=bsz)
        on = census(arms.patched, "draft-round", {"EXL3_OVL_MTP_INDEX_SHARE": "1"}, drafter="mtp", bsz=bsz)
        assert stock["metrics"]["eager-launches"] == off["metrics"]["eager-launches"]
        depth_off, depth_on = (d["detail"]["per_depth_eager_launches"] for d in (off, on))
        assert depth_on["0"] == depth_off["0"]  # depth 0 still runs the indexer and records its selection
        # per depth >= 1: the indexer's 3 + 2 * bsz launches become mtp_extend_selection's 2 + 2 * bsz
        assert all(depth_on[d] == depth_off[d] - 1 for d in ("1", "2", "3"))
        assert on["metrics"]["eager-launches"] == off["metrics"]["eager-launches"] - 3
        assert on["metrics"]["gemm-bytes"] < 0.6 * off["metrics"]["gemm-bytes"]  # the scoring's key reads
        kinds = on["detail"]["kinds"]
        assert (
            kinds["eager-launches:kernel:dsa_triton.dsa_indexer_scores"] == 3 * bsz
        )  # depth 0 only, 3 rounds
        assert any(s.startswith("exllamav3/modules/mla_attn.py:") for s, _ in on["sites"]["eager-launches"])
        for d in (off, on):
            assert d["metrics"]["host-syncs"] == stock["metrics"]["host-syncs"]
            assert d["metrics"]["h2d-copies"] == stock["metrics"]["h2d-copies"]


def test_mtp_index_share_takes_depths_off_the_bc_graph(arms: Arms) -> None:
    """With the BC decode graph (the default for a supported EXL3 layer), stock replays it at every depth; 0019 runs
    depths >= 1 on the eager dispatch path, so eager launches grow: what the device check must time."""
    off = census(arms.patched, "draft-round", drafter="mtp", bsz=1, bc_mla=True)
    on = census(
        arms.patched, "draft-round", {"EXL3_OVL_MTP_INDEX_SHARE": "1"}, drafter="mtp", bsz=1, bc_mla=True
    )
    assert off["metrics"]["graph-launches"] == 4 and on["metrics"]["graph-launches"] == 1
    assert on["metrics"]["eager-launches"] > off["metrics"]["eager-launches"]
