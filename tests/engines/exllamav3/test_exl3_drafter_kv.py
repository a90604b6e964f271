"""Drafter KV patches: forced window, draft cache size, zero-copy ring, per-forward tables, draft cache quant,
prefill crop, quantized ring.

Every test runs the stock wheel and the patched wheel on the same inputs (CPU, extension stand-in). Several payloads
share one probe process (run_cases) to keep the suite short.
"""

from __future__ import annotations

from typing import Any

import pytest
from exl3_probes import probe, run_cases

from overlay.check.envs import Arms

MIXED = ["sliding_attention", "full_attention", "full_attention"]
TOKENS_384K = 384 * 1024


def test_force_draft_window(arms: Arms) -> None:
    base = {"layer_types": MIXED, "cache_tokens": TOKENS_384K}
    (stock,) = run_cases(arms.stock, "drafter_model.py", [base])
    off, forced, causal, refused = run_cases(
        arms.patched,
        "drafter_model.py",
        [
            base,
            {**base, "draft_window": 512},
            {**base, "draft_window": 512, "arch": "dflash"},
            {**base, "draft_window": 512, "swa_full": True},
        ],
    )
    # off: the patched drafter is the stock drafter (module types, windows, caps, cache sizes)
    assert off == stock
    assert (
        stock["paged_bytes"] == 2 * TOKENS_384K * 2 * 64 * 2 * 2
    )  # 2 full layers x K,V x 2 heads x 64 x fp16

    assert forced["modules"] == ["SlidingAttention"] * 3
    # the checkpoint's sliding layer keeps its window; forced full layers get bidirectional (block) windows
    assert forced["windows"] == [[255, 0], [511, 511], [511, 511]]
    # one SWAState drives every ring of a sequence: the sliding layer's ring takes the forced layers' size
    assert forced["kv_state_size"] == [1024] * 3 and stock["kv_state_size"] == [768, None, None]
    assert forced["paged_bytes"] == 0 and forced["num_layers"] == 0
    assert forced["caps"]["recurrent_states"] is True
    # ring per slot: kv_state_size rows x K,V x 2 heads x 64 x fp16
    assert forced["ring_bytes"] == sum(s * 2 * 2 * 64 * 2 for s in forced["kv_state_size"])

    assert causal["modules"] == ["SlidingAttention"] * 3
    assert "swa_full" in refused["error"] and "draft_window" in refused["error"]


MIXED_RING_CASES: list[dict[str, Any]] = [
    # the checkpoint's 256-token sliding layer next to a layer forced to 1024 (W above the checkpoint window)
    {
        "seed": 1,
        "layer_types": ["sliding_attention", "full_attention"],
        "draft_window": 1024,
        "steps": 150,
        "ring": True,
    },
    # forced layer first, linear (stock shift-copy) buffers, two sequences, prefill chunks larger than any ring
    {
        "seed": 3,
        "layer_types": ["full_attention", "sliding_attention"],
        "draft_window": 700,
        "steps": 120,
        "bsz": 2,
        "big": [1500, 2100],
    },
    # W below the checkpoint window (1024): chunks larger than the forced layer's own ring (768 rows)
    {
        "seed": 2,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "window": 1024,
        "draft_window": 256,
        "steps": 120,
        "ring": True,
        "big": [1500, 2100],
        "bsz": 2,
    },
]


def test_mixed_window_rings_match_unbounded(arms: Arms) -> None:
    """0001 with the checkpoint's own sliding layers: one SWAState drives every ring, so every ring has one size;
    every layer's every output equals attention over its own window of an unbounded history, through prefill
    write-backs (chunks larger than a ring), block forwards, verified write-backs, rewinds and checkpoints."""
    control = {"seed": 4, "layer_types": ["sliding_attention"] * 2, "steps": 60}
    (stock,) = run_cases(arms.stock, "mixed_ring.py", [control])
    off, *mixed = run_cases(arms.patched, "mixed_ring.py", [control, *MIXED_RING_CASES])
    # off (no draft_window): the stock drafter, output for output
    assert off == stock and stock["errors"] == [] and stock["mismatches"] == [0, 0]
    for payload, doc in zip(MIXED_RING_CASES, mixed):
        assert doc["errors"] == [], payload
        assert doc["mismatches"] == [0] * len(payload["layer_types"]), payload
        assert min(doc["checked"]) > 600 and doc["ring"] is payload.get("ring", False)
        # each layer keeps its own window (checkpoint sliding layers theirs, forced layers W), one ring size
        assert len(set(doc["kv_state_size"])) == 1
        assert sorted({w for w, _ in doc["windows"]}) == sorted(
            {payload.get("window", 256) - 1, payload["draft_window"] - 1}
        )
        # several wraps of the ring, every operation exercised
        assert min(doc["final_positions"]) > 3 * doc["kv_state_size"][0]
        assert all(n > 0 for op, n in doc["counts"].items() if op != "big_prefill" or payload.get("big"))


@pytest.mark.long  # three 900-step probe runs, ~45 s on 2 cores
def test_shared_kv_ring_source_after_shifts(arms: Arms) -> None:
    """0002: a query-only drafter layer (SharedKVAttention) reading the target's window ring in its own, later
    forward reads the target's last window + 1 keys at every step, across every window shift."""
    payload = {"seed": 0, "steps": 900, "bsz": 2, "max_step": 3}
    stock = arms.stock.run_json(probe("shared_kv_ring.py"), payload)
    off = arms.patched.run_json(probe("shared_kv_ring.py"), payload)
    ring = arms.patched.run_json(probe("shared_kv_ring.py"), {**payload, "ring": True})
    assert off == stock and stock["ring"] is False and ring["ring"] is True
    assert stock["shifts"] >= 8 and ring["shifts"] == stock["shifts"]
    assert stock["mismatches"] == 0 and ring["mismatches"] == 0, ring["examples"]
    assert ring["checked"] == stock["checked"] == 2 * payload["steps"]


RING_SCHEDULES = [
    {"seed": 1, "window": 256, "steps": 120},
    {"seed": 2, "window": 200, "steps": 80, "bsz": 2, "causal": False},
]


@pytest.mark.parametrize("schedule", RING_SCHEDULES, ids=["w256-bsz1-causal", "w200-bsz2-block"])
def test_swa_ring_matches_stock_and_unbounded(arms: Arms, schedule: dict[str, Any]) -> None:
    stock = arms.stock.run_json(probe("swa_ring.py"), {**schedule, "ring": False})
    ring = arms.patched.run_json(probe("swa_ring.py"), {**schedule, "ring": True})
    assert ring["ring"] is True and stock["ring"] is False
    # every step's attention output: ring == stock, bit for bit, and both == the unbounded history
    assert ring["digests"] == stock["digests"]
    assert ring["oracle_mismatches"] == 0 and stock["oracle_mismatches"] == 0
    # the schedule wraps the ring repeatedly and exercises every operation
    assert ring["final_positions"][0] > 2 * ring["kv_state_size"]
    assert all(ring["counts"][op] > 0 for op in ("prefill", "decode", "write_back", "rewind", "stash"))
    # stock shifts by copying whole slots; the ring never copies
    assert stock["clones"] > 0 and ring["clones"] == 0


def test_swa_ring_off_is_stock(arms: Arms) -> None:
    schedule = {**RING_SCHEDULES[0], "steps": 60}
    stock = arms.stock.run_json(probe("swa_ring.py"), schedule)
    patched = arms.patched.run_json(probe("swa_ring.py"), schedule)
    assert patched == stock


@pytest.mark.long  # ~25 s on 2 cores: scripts/test_long.sh
def test_swa_tables_shared_per_forward(arms: Arms) -> None:
    payload = {"seed": 0, "steps": 120}
    stock = arms.stock.run_json(probe("swa_tables.py"), payload)
    shared = arms.patched.run_json(probe("swa_tables.py"), {**payload, "ring": True, "share": True})

    def strip(doc: dict[str, Any]) -> list[list[Any]]:
        return [[s["seqlens"], s["wshift"]] for s in doc["steps"]]

    # same in-window lengths and window shifts at every step, one upload per forward instead of one per layer
    assert strip(shared) == strip(stock)
    assert all(s["same_across_layers"] for s in shared["steps"])
    assert stock["uploads"] == 3 * stock["num_steps"]
    assert shared["uploads"] == shared["num_steps"]
    # the flag off (no ring): the stock per-layer path, whatever the caller passes
    linear = arms.patched.run_json(probe("swa_tables.py"), {**payload, "share": True})
    assert strip(linear) == strip(stock) and linear["uploads"] == stock["uploads"]
    # a caller that reuses one params dict across forwards gets each forward's own tables, never the last one's
    reused = arms.patched.run_json(
        probe("swa_tables.py"), {**payload, "ring": True, "share": True, "reuse": True}
    )
    assert strip(reused) == strip(stock) and all(s["same_across_layers"] for s in reused["steps"])
    assert reused["uploads"] == shared["uploads"]


def test_draft_cache_quant_arg(arms: Arms) -> None:
    cases: list[dict[str, Any]] = [{"argv": []}, {"argv": ["-cq", "4"]}, {"argv": ["-dcq", "8"]}]
    stock = run_cases(arms.stock, "model_init_caches.py", cases)
    patched = run_cases(
        arms.patched,
        "model_init_caches.py",
        cases[:2]
        + [
            {"argv": ["-cq", "4", "-dcq", "8"]},
            {"argv": ["-dcq", "8,6", "-cca", "0.5"]},
            {"argv": ["-cq", "8", "-dcq", "fp16"]},
            {"argv": ["-dcq", "9"]},
        ],
    )
    # unset: both arms build the same target and draft caches, fp16 or following --cache_quant
    assert patched[:2] == stock[:2]
    assert stock[2]["error"].startswith("argparse")

    q4_q8, kv, fp16, bad = patched[2:]
    assert q4_q8["cache"]["bits"] == [[4, 4]]
    assert q4_q8["draft_cache"]["types"] == ["CacheLayer_quant"] and q4_q8["draft_cache"]["bits"] == [[8, 8]]
    assert q4_q8["draft_cache"]["attached"] == 3 and q4_q8["draft_cache_refs"] == 1
    assert kv["cache"]["types"] == ["CacheLayer_fp16"]
    assert kv["draft_cache"]["bits"] == [[8, 6]] and kv["draft_cache"]["compand_a"] == [0.5]
    assert fp16["draft_cache"]["types"] == ["CacheLayer_fp16"] and fp16["cache"]["bits"] == [[8, 8]]
    assert "expected fp16" in bad["error"]


def test_dflash_prefill_crop(arms: Arms) -> None:
    crop = {"EXL3_OVL_DFLASH_PREFILL_CROP": "1"}
    chunks: dict[str, Any] = {"seed": 0, "chunks": [100, 2048, 37, 4096, 700, 3000]}
    # mixed ring sizes (checkpoint sliding layer 256 + forced 1024 window): crop to the largest ring
    mixed = {
        "seed": 1,
        "chunks": [4096, 10, 2500],
        "layer_types": ["sliding_attention", "full_attention"],
        "draft_window": 1024,
    }
    (stock,) = run_cases(arms.stock, "dflash_prefill.py", [chunks])
    off, cropped, cropped_ring, mixed_full, mixed_cropped = run_cases(
        arms.patched,
        "dflash_prefill.py",
        [
            chunks,
            {**chunks, "env": crop},
            {**chunks, "env": {**crop, "EXL3_OVL_SWA_RING": "1"}},
            mixed,
            {**mixed, "env": crop},
        ],
    )
    assert off == stock
    assert stock["projected"]["fc_rows"] == sum(chunks["chunks"])
    for doc in (cropped, cropped_ring):
        # same window contents (every layer), positions and window starts after every chunk
        assert doc["after"] == stock["after"]
        assert doc["projected"]["fc_rows"] < stock["projected"]["fc_rows"] // 2
    assert mixed_cropped["after"] == mixed_full["after"] and mixed_cropped["kv_state_size"] == [1536, 1536]
    assert mixed_cropped["projected"]["fc_rows"] < mixed_full["projected"]["fc_rows"]


@pytest.mark.long  # ~80 s on 2 cores: scripts/test_long.sh
def test_swa_ring_q8(arms: Arms) -> None:
    schedule = {"seed": 4, "window": 256, "steps": 50}
    stock = arms.stock.run_json(probe("swa_ring.py"), {**schedule, "grid": True})
    q8 = arms.patched.run_json(
        probe("swa_ring.py"), {**schedule, "grid": True, "ring": True, "quant": [8, 8]}
    )
    # K/V on the reference codec's grid: the quantized ring's bookkeeping (rows, page tables, stash of words and
    # scales) reproduces the fp16 window exactly, step by step
    assert q8["state"] == "SWALayerState_quant" and stock["state"] == "SWALayerState"
    assert q8["digests"] == stock["digests"] and q8["oracle_mismatches"] == 0
    assert q8["counts"]["stash"] > 0 and q8["counts"]["write_back"] > 0
    assert q8["state_bytes"] * 100 // stock["state_bytes"] == 53  # 8.5 bits per value instead of 16

    gauss = {"seed": 5, "window": 256, "steps": 30, "ring": True}
    err8 = arms.patched.run_json(probe("swa_ring.py"), {**gauss, "quant": [8, 8]})["max_abs_vs_oracle"]
    err4 = arms.patched.run_json(probe("swa_ring.py"), {**gauss, "quant": [4, 4]})["max_abs_vs_oracle"]
    assert 0 < err8 < 0.05 < err4 < 1.0

    # the extension's own format: rows quantized with the CUDA kernel's arithmetic (_qcache_real: quant_block_x4's
    # butterfly, fp32 scale absmax + 1e-10, fma and floor), read back by upstream's Triton decoder _qc_load_v on
    # Triton's CPU interpreter at decode and by the CUDA dequant's arithmetic for a prefill: the ring reads back
    # exactly what a quantized cache holds, over three wraps, and its outputs stay within the format's error of the
    # fp16 history
    real = {"seed": 4, "window": 256, "steps": 100, "ring": True, "codec": "real", "head_dim": 32}
    r8 = arms.patched.run_json(probe("swa_ring.py"), {**real, "quant": [8, 8]})
    r4 = arms.patched.run_json(probe("swa_ring.py"), {**real, "quant": [4, 4], "steps": 30})
    # three sequences: the batched row writes
    r8b = arms.patched.run_json(probe("swa_ring.py"), {**real, "quant": [8, 8], "steps": 60, "bsz": 3})
    for doc in (r8, r4, r8b):
        check = doc["codec_check"]
        assert check["max_half_steps"] < 1.25  # encoder == the format upstream decodes
        assert check["authors_codec_rel_l2"] > 0.5  # the authors' first codec is not that format
        # the kernel's butterfly is upstream's H32 (whose entries are fp16), and its dequant agrees with upstream's
        # decoder rotated back to fp16 rounding
        assert check["h32_signs_equal"] and check["h32_max_abs"] < 1e-4
        assert check["cuda_vs_triton_max_abs"] < 0.05
        assert doc["quant_oracle_mismatches"] == 0 and doc["state"] == "SWALayerState_quant"
        # the ring's stored words and scales, and what upstream's decoder reads from them, equal the kernel
        # arithmetic's encoding of each window row bit for bit; a code the extension's approximate reciprocal could
        # change is counted (rcp_sensitive: at most a few in 10^5 values)
        rows = doc["ring_rows"]
        assert rows["rows"] > 0 and rows["mismatches"] == 0 and rows["rcp_sensitive"] * 1000 < rows["rows"]
    assert r8["final_positions"][0] > 3 * r8["kv_state_size"]
    assert r8["codec_check"]["rel_l2"] < 0.01 < r4["codec_check"]["rel_l2"] < 0.1
    assert 0 < r8["max_abs_vs_oracle"] < 0.05 < r4["max_abs_vs_oracle"] < 1.0

    # row writes batched per layer: one table upload per write (a DFlash write-back or a prefill's surviving rows,
    # however many sequences; the previous 0008 uploaded a block table and a start row per sequence), and the
    # prefill's fp16 scratch covers the hot windows of the batch, not the whole ring pool
    writes, counts = r8b["quant_writes"], r8b["counts"]  # the previous 0008: 66 calls, 132 uploads, 12 pages
    assert writes["rows"] > writes["calls"] > 0 and writes["uploads"] <= writes["calls"]
    assert writes["calls"] == writes["steps"] >= counts["write_back"] + counts["prefill"]
    assert writes["launches"] <= writes["rows"]
    pps = r8b["kv_state_size"] // 256
    assert 0 < writes["scratch_pages"] <= 3 * pps < writes["pool_pages"]

    # model_init: --draft_cache_quant reaches the drafter's rings when the ring mode is on
    argv = ["-dw", "512", "-dcq", "8"]
    on, off = run_cases(
        arms.patched,
        "model_init_caches.py",
        [{"argv": argv, "env": {"EXL3_OVL_SWA_RING": "1"}}, {"argv": argv}],
    )
    assert on["draft_cache"]["ring_types"] == ["SWALayerState_quant"]
    assert off["draft_cache"]["ring_types"] == ["SWALayerState"]
    assert on["draft_cache"]["ring_bytes"] < off["draft_cache"]["ring_bytes"]


@pytest.mark.long  # ~2 minutes on 2 cores: scripts/test_long.sh
def test_swa_ring_on_upstream_kernels_interpreted(arms: Arms) -> None:
    """The ring schedules on upstream's own Triton paged-attention kernels (paged_attn_triton_decode / _prefill, run by
    Triton's interpreter on CPU: probes/_triton_cpu.py) instead of the probes' torch references, which were written
    alongside the patches: stock's linear buffers (shift copies) and the patched ring give bit-identical outputs over
    several wraps with rewinds and checkpoints, both within the kernels' rounding of attention over the unbounded
    history; the Q8 ring (0008) read by the decode kernel's online dequant (qc=) and, for a prefill, from the compact
    fp16 scratch through an identity table, stays within the kernels' rounding of attention over the rows as quantized."""
    fp16 = {"seed": 6, "window": 256, "steps": 100, "kernels": "interpret"}
    stock = arms.stock.run_json(probe("swa_ring.py"), fp16)
    ring = arms.patched.run_json(probe("swa_ring.py"), {**fp16, "ring": True})
    assert ring["ring"] and not stock["ring"] and stock["clones"] > 0 == ring["clones"]
    assert ring["digests"] == stock["digests"]
    assert ring["final_positions"][0] > 3 * ring["kv_state_size"]
    assert ring["counts"]["rewind"] > 0 and ring["counts"]["stash"] > 0 and ring["counts"]["prefill"] > 0
    assert 0 < ring["max_abs_vs_oracle"] < 0.02  # the interpreter's arithmetic, not the torch reference's
    q8 = arms.patched.run_json(
        probe("swa_ring.py"),
        {**fp16, "steps": 40, "bsz": 2, "ring": True, "codec": "real", "head_dim": 32, "quant": [8, 8]},
    )
    assert q8["state"] == "SWALayerState_quant" and q8["counts"]["prefill"] > 0
    assert q8["final_positions"][0] > q8["kv_state_size"]
    assert q8["max_abs_vs_quant_oracle"] < 0.01 < q8["max_abs_vs_oracle"] < 0.05
    assert q8["ring_rows"]["mismatches"] == 0 and q8["quant_writes"]["uploads"] <= q8["quant_writes"]["steps"]


@pytest.mark.long  # ~75 s on 2 cores: scripts/test_long.sh
def test_swa_ring_static_tables(arms: Arms) -> None:
    """EXL3_OVL_SWA_RING_STATIC=1: the ring step's tables through one persistent pinned + device buffer: the same
    tables and attention outputs as the ring, and no per-step device tensor or pageable upload (the census shows
    the step capturable: tests/census/test_exl3_census.py). The DFlash write-back (write_state_rows) writes each
    layer's block with one index_copy_ per tensor through a persistent index (RingWriteBuffer): ring contents and
    outputs bit for bit those of the ring's per-row copies (the previous code) over wraps, rewinds and checkpoints,
    and the same ops per write-back at every batch size (the per-row copies: 2 per row and tensor run)."""
    payload = {"seed": 0, "steps": 120}
    stock = arms.stock.run_json(probe("swa_tables.py"), payload)
    ring = arms.patched.run_json(probe("swa_tables.py"), {**payload, "ring": True, "share": True})
    static = arms.patched.run_json(
        probe("swa_tables.py"), {**payload, "ring": True, "share": True, "static": True}
    )
    reused = arms.patched.run_json(
        probe("swa_tables.py"), {**payload, "ring": True, "share": True, "static": True, "reuse": True}
    )
    for doc in (static, reused):
        assert [s["tables"] for s in doc["steps"]] == [s["tables"] for s in ring["steps"]]
        assert [[s["seqlens"], s["wshift"]] for s in doc["steps"]] == [
            [s["seqlens"], s["wshift"]] for s in stock["steps"]
        ]
        assert all(s["same_across_layers"] for s in doc["steps"])
        assert doc["uploads"] == 0  # no host_to_device of a fresh host tensor
    assert ring["uploads"] == ring["num_steps"]
    schedule = RING_SCHEDULES[1]
    plain = arms.stock.run_json(probe("swa_ring.py"), {**schedule, "ring": False})
    persistent = arms.patched.run_json(probe("swa_ring.py"), {**schedule, "ring": True, "static": True})
    assert persistent["digests"] == plain["digests"] and persistent["oracle_mismatches"] == 0
    assert persistent["clones"] == 0
    # the write-back: the same ring rows as the per-row copies (EXL3_OVL_SWA_RING=1 alone) after every write-back,
    # in a causal one-row schedule and a three-row block schedule (rows of 1..8 accepted tokens: the rest of each
    # block goes to the spare row), each over more than two wraps of the ring
    ops = {2: persistent["write_ops"]}
    for bsz, schedule in ((1, RING_SCHEDULES[0]), (3, {**RING_SCHEDULES[1], "steps": 120, "seed": 3})):
        sched = {**schedule, "bsz": bsz, "ring": True}
        copies = arms.patched.run_json(probe("swa_ring.py"), sched)
        indexed = arms.patched.run_json(probe("swa_ring.py"), {**sched, "static": True})
        assert indexed["digests"] == copies["digests"] and indexed["oracle_mismatches"] == 0
        assert indexed["ring_digests"] == copies["ring_digests"] and len(indexed["ring_digests"]) > 10
        assert min(indexed["final_positions"]) > 2 * indexed["kv_state_size"]
        assert all(indexed["counts"][op] > 0 for op in ("write_back", "rewind", "stash"))
        assert all(sum(o.values()) >= 2 * bsz for o in copies["write_ops"])  # k and v per row: grows with bsz
        ops[bsz] = indexed["write_ops"]
    # per write-back: the index staged and uploaded (two copies), one index_copy_ for k and one for v, whatever
    # bsz (the first write-back also makes the persistent buffers)
    for bsz, per_call in ops.items():
        assert [{k: n for k, n in o.items() if k != "zeros"} for o in per_call] == [
            {"copy_": 2, "index_copy_": 2}
        ] * len(per_call), bsz
