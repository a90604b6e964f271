"""Speculative-round patches: sync removal (events, batched readback with device-side accept lengths, one host sync
per round), batched verify sampling, the fused-tier bound, the whole-round drafter graph, the drafter warmup and the
shared MTP selection.

Every test runs the stock wheel and the patched wheel on the same inputs (CPU, extension stand-in). Device tensors
are CPU tensors posing as CUDA tensors (probes/_devsim.py), so the CUDA branches run and every host read of device
data counts as a sync. Cases share one probe process per arm (run_cases); the probe runs are module-scoped fixtures
shared by the tests.
"""

from __future__ import annotations

from typing import Any

import pytest
from exl3_probes import run_cases

from overlay.check.envs import Arms

EVENT = {"EXL3_OVL_EVENT_SYNC": "1"}
READBACK = {"EXL3_OVL_VERIFY_READBACK": "1"}
ROUND = {"EXL3_OVL_ROUND_SYNC": "1", "EXL3_OVL_EVENT_SYNC": "1"}
BATCH = {"EXL3_OVL_BATCH_SAMPLE": "1", "EXL3_OVL_ROUND_SYNC": "1", "EXL3_OVL_EVENT_SYNC": "1"}

Spec = tuple[dict[str, Any], dict[str, dict[str, Any]]]  # stock docs by case, patched docs by run and case
# (name, payload); each runs on both arms, and on the patched arm with several flag sets
SPEC_CASES: dict[str, dict[str, Any]] = {
    "bsz3": {"seed": 1, "bsz": 3, "rounds": 6, "corrupt": 10, "decode_rounds": 2},
    "bsz3-temp": {"seed": 2, "bsz": 3, "rounds": 5, "corrupt": 10, "sampler": "temp"},
    "bsz1-k11": {"seed": 3, "bsz": 1, "block": 12, "rounds": 5, "corrupt": 8},
    "host-embed": {"seed": 4, "bsz": 3, "rounds": 4, "corrupt": 10, "embed": "host"},
    "host-drafts": {"seed": 5, "bsz": 3, "rounds": 4, "corrupt": 10, "drafter": "host"},
    "mixed": {"seed": 6, "bsz": 3, "rounds": 5, "corrupt": 10, "first_token_job": True, "serial_job": True},
    "ending": {"seed": 7, "bsz": 5, "rounds": 8, "corrupt": 10, "max_new": 14},
    "fused-temp": {"seed": 8, "bsz": 3, "rounds": 4, "corrupt": 10, "sampler": "fused-temp"},
    "fused-minp": {"seed": 9, "bsz": 2, "rounds": 4, "corrupt": 10, "sampler": "fused-minp"},
}
PATCHED_RUNS: dict[str, tuple[dict[str, str], list[str]]] = {
    "off": ({}, list(SPEC_CASES)),
    "event": (EVENT, ["bsz3"]),
    "readback": (READBACK, ["bsz3", "bsz3-temp", "host-drafts", "mixed", "ending", "host-embed"]),
    "round": (ROUND, ["bsz3", "bsz3-temp", "bsz1-k11", "host-embed", "mixed", "ending"]),
    "round+readback": ({**ROUND, **READBACK}, ["host-embed"]),
    "batch": (BATCH, ["bsz3", "bsz3-temp", "fused-temp", "fused-minp", "mixed"]),
}
OUTPUTS = ("tokens", "results", "accepted", "rejected", "pages", "kv_positions", "rng", "kv_updates")


@pytest.fixture(scope="module")
def spec(arms: Arms) -> Spec:
    names = list(SPEC_CASES)
    stock = dict(zip(names, run_cases(arms.stock, "spec_round.py", [SPEC_CASES[n] for n in names])))
    order = [(run, name) for run, (_, cases) in PATCHED_RUNS.items() for name in cases]
    docs = run_cases(
        arms.patched,
        "spec_round.py",
        [{**SPEC_CASES[name], "env": PATCHED_RUNS[run][0]} for run, name in order],
    )
    patched: dict[str, dict[str, Any]] = {}
    for (run, name), doc in zip(order, docs):
        patched.setdefault(run, {})[name] = doc
    return stock, patched


def _same_outputs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a[k] == b[k] for k in OUTPUTS)


def _spec_syncs(doc: dict[str, Any]) -> list[int]:
    return [r["syncs"] for r in doc["per_round"] if r["kind"] == "spec"]


def test_round_flags_off_are_stock(spec: Spec) -> None:
    stock, patched = spec
    for name, doc in patched["off"].items():
        assert doc == stock[name], name


def test_event_sync(spec: Spec) -> None:
    stock, patched = spec
    s, p = stock["bsz3"], patched["event"]["bsz3"]
    assert _same_outputs(s, p)
    # every device-wide synchronize (decode and verify readbacks) became one event wait
    assert s["syncs"]["wait:device_synchronize"] > 0
    assert "wait:device_synchronize" not in p["syncs"]
    assert p["syncs"]["wait:event"] == s["syncs"]["wait:device_synchronize"] == p["syncs"]["event_record"]
    assert [r["syncs"] for r in p["per_round"]] == [r["syncs"] for r in s["per_round"]]


def test_verify_readback(spec: Spec) -> None:
    stock, patched = spec
    for name, p in patched["readback"].items():
        assert _same_outputs(stock[name], p), name
    s, p = stock["bsz3"], patched["readback"]["bsz3"]
    # stock: the blocking drafts copy + one synchronize per job; patched: the drafts copy + one readback
    assert _spec_syncs(s) == [4] * 6 and _spec_syncs(p) == [2] * 6
    decode_copies = 2 * 3  # the case starts with 2 decode rounds (one pinned copy per job each)
    assert (
        s["syncs"]["d2h_async"] == 6 * 3 * 8 + decode_copies and p["syncs"]["d2h_async"] == 6 + decode_copies
    )
    # the device-side accept lengths reproduce the serial walk over varied schedules: every length 0..K occurs
    seen = {n for doc in patched["readback"].values() for rnd in doc["accepted"] for n in rnd}
    assert seen >= set(range(8))


def test_round_sync(spec: Spec) -> None:
    stock, patched = spec
    for name, p in patched["round"].items():
        assert _same_outputs(stock[name], p), name
    bsz3, bsz1 = patched["round"]["bsz3"], patched["round"]["bsz1-k11"]
    assert _spec_syncs(stock["bsz3"]) == [4] * 6 and _spec_syncs(bsz3) == [1] * 6
    assert _spec_syncs(stock["bsz1-k11"]) == [2] * 5 and _spec_syncs(bsz1) == [1] * 5
    assert bsz3["syncs"]["d2h_async"] == 2 * 6 + 2 * 3  # drafts + readback per round (+ 2 decode rounds)
    assert bsz3["forward_inputs"][-1] == "device" and stock["bsz3"]["forward_inputs"][-1] == "host"
    # a host-resident embedding table needs the drafts on the host: one wait for them stays
    host = patched["round+readback"]["host-embed"]
    assert _same_outputs(stock["host-embed"], host)
    assert _spec_syncs(stock["host-embed"]) == [4] * 4 and _spec_syncs(host) == [2] * 4
    assert host["forward_inputs"][-1] == "host"


def test_batched_verify_sampling(spec: Spec) -> None:
    stock, patched = spec
    for name, p in patched["batch"].items():
        assert _same_outputs(stock[name], p), name
    # one sampler call per job and round instead of one per verified position (W = 8)
    assert stock["bsz3-temp"]["kernel_calls"]["gumbel_noise_f32"] == 5 * 3 * 8
    assert patched["batch"]["bsz3-temp"]["kernel_calls"]["gumbel_noise_rows"] == 5 * 3
    assert "gumbel_noise_f32" not in patched["batch"]["bsz3-temp"]["kernel_calls"]
    assert stock["fused-temp"]["kernel_calls"]["fused_sampler"] == 4 * 3 * 8
    assert patched["batch"]["fused-temp"]["kernel_calls"]["fused_sampler_rows"] == 4 * 3
    assert patched["batch"]["fused-minp"]["kernel_calls"]["fused_sampler_rows"] == 4 * 2
    # greedy stacks take the batched call too; the first-token and serial jobs keep per-position calls
    assert _spec_syncs(patched["batch"]["bsz3"]) == [1] * 6


def test_fused_tier_bound(arms: Arms) -> None:
    (stock,) = run_cases(arms.stock, "fused_tier.py", [{}])
    off, on, bad = run_cases(
        arms.patched,
        "fused_tier.py",
        [{}, {"env": {"EXL3_OVL_BSZN": "16"}}, {"env": {"EXL3_OVL_BSZN": "12"}}],
    )
    assert stock["fused_tokens"] == list(range(1, 9))
    assert {k: v for k, v in off.items() if k != "constants"} == {
        k: v for k, v in stock.items() if k != "constants"
    }
    assert on["statics"] == [[2, 16, 128], [2, 16, 256], [1, 16, 256], [1, 16, 256]]
    assert on["fused_tokens"] == list(range(1, 17))
    # MoE tier: 16 tokens while 16 x top-k fits the kernels' 256 slots, top-k 32 stays at 8
    assert on["moe_tier"] == {"1": [16, 16], "6": [96, 16], "8": [128, 16], "16": [256, 16], "32": [256, 8]}
    assert off["moe_tier"] == stock["moe_tier"]
    # the C++ sources shipped in each wheel agree with its Python side
    c_stock, c = stock["constants"], off["constants"]
    assert c_stock["cpp_max_bszn"] == c_stock["py_max_bszn"] == 8
    # the compiled capacity stays stock's (8 graph slots per MLP) unless the extension is built with the flag
    assert c["cpp_max_bszn"] == 8 and c["build_defines"] == [] and c_stock["build_defines"] == []
    c_on = on["constants"]
    assert c_on["cpp_max_bszn"] >= max(c_on["py_caps"]) == 16 and c["py_max_bszn"] == 8
    assert c_on["build_defines"] == ["-DEXL3_OVL_MAX_BSZN=16"]
    assert c["cpp_max_slots"] == c["py_max_slots"] == 256 and c["split_ref_tokens"] == 8
    assert "EXL3_OVL_BSZN" in bad["error"] and "12" in bad["error"]


def test_drafter_round_graph(arms: Arms) -> None:
    base = {"seed": 0, "bsz": 2, "rounds": 8}
    graph = {"EXL3_OVL_DRAFTER_GRAPH": "1"}
    (stock,) = run_cases(arms.stock, "drafter_graph.py", [base])
    off, ok, stale, sync, conf, grow, ring = run_cases(
        arms.patched,
        "drafter_graph.py",
        [
            base,
            {**base, "env": graph},
            {**base, "env": graph, "mode": "stale"},
            {**base, "env": graph, "mode": "sync"},
            {**base, "env": graph, "mode": "conf"},
            {**base, "env": graph, "grow_at": 5},
            {**base, "env": graph, "recurrent": True},
        ],
    )
    assert off == stock and stock["drafts"] == stock["expected"] and stock["eager_calls"] == 8
    for doc in (ok, stale, sync, conf, grow, ring):
        assert doc["drafts"] == doc["expected"]
    # 2 warm-up rounds, one capture, 6 replays of which 2 are checked against an eager round
    g = ok["graphs"]
    assert (g["captured"], g["replayed"], g["validated"], g["failed"]) == (1, 6, 2, 0)
    assert ok["eager_calls"] == 4 and ok["drafts"] == stock["drafts"]
    assert (
        ok["reused_upload"] == 0
    )  # the capture records its own uploads (params as the generator built them)
    # a replay of capture-time values is caught by the first validation and the shape falls back
    assert stale["graphs"]["failed"] == 1 and "differed" in stale["graphs"]["entries"][0][2]
    assert stale["graphs"]["replayed"] == 1 and stale["eager_calls"] == 8
    assert "capture failed" in sync["graphs"]["entries"][0][2] and sync["eager_calls"] == 8
    assert "draft confidence" in conf["graphs"]["entries"][0][2] and conf["graphs"]["captured"] == 0
    assert grow["graphs"]["captured"] == 2 and len(grow["graphs"]["entries"]) == 2
    assert ring["graphs"] is None and ring["eager_calls"] == 8  # window-ring drafters stay eager


def test_drafter_round_graph_rings(arms: Arms) -> None:
    """A window-ring drafter's round is captured once the ring step tables are persistent
    (EXL3_OVL_SWA_RING_STATIC=1): each replay restages the window decisions and advances the states as the
    eager round does (same drafts, same final positions and window starts); without them it stays eager."""
    base = {"seed": 0, "bsz": 2, "rounds": 12, "mode": "ring"}
    rings = {"EXL3_OVL_SWA_RING": "1", "EXL3_OVL_SWA_RING_STATIC": "1"}
    graph = {"EXL3_OVL_DRAFTER_GRAPH": "1"}
    eager, captured, plain = run_cases(
        arms.patched,
        "drafter_graph.py",
        [
            {**base, "env": rings},
            {**base, "env": {**rings, **graph}},
            {**base, "env": {"EXL3_OVL_SWA_RING": "1", **graph}},
        ],
    )
    assert eager["drafts"] == eager["expected"] and eager["graphs"] is None and eager["eager_calls"] == 12
    g = captured["graphs"]
    assert (g["captured"], g["replayed"], g["validated"], g["failed"]) == (1, 10, 2, 0)
    assert captured["drafts"] == eager["drafts"] and captured["ring_states"] == eager["ring_states"]
    # the windows moved during the replayed rounds (the restaged decisions include shifts)
    assert [s[1] for s in captured["ring_states"][:2]] != [s[1] for s in captured["ring_initial"][:2]]
    assert plain["graphs"] is None and plain["eager_calls"] == 12 and plain["drafts"] == eager["drafts"]


def test_warmup_draft(arms: Arms) -> None:
    cases: list[dict[str, Any]] = [{"argv": []}, {"argv": ["-wd"]}]
    stock = run_cases(arms.stock, "warmup_draft.py", cases)
    off, on, ndt, no_draft, no_tok = run_cases(
        arms.patched,
        "warmup_draft.py",
        cases
        + [
            {"argv": ["-wd", "-ndt", "5"]},
            {"argv": ["-wd"], "draft": False},
            {"argv": ["-wd"], "tokenizer": False},
        ],
    )
    assert off == stock[0]
    assert stock[1]["error"].startswith("argparse")
    names = [e[0] for e in on["events"]]
    assert names == ["load", "load", "model.warmup", "generator", "enqueue", "close", "returned"]
    gen, job = on["events"][3][1], on["events"][4][1]
    assert gen == {
        "cache_is_target": True,
        "draft_cache_is_draft": True,
        "draft_model": "DFlash2Model",
        "model": "LlamaModel",
        "recurrent_cache_size": 0,
    }
    assert job == {"in_vocab": True, "max_new_tokens": 4 * 8, "prompt": 320, "sampler": "ArgmaxSampler"}
    assert on["events"][5] == ["close", 4]
    assert ndt["events"][4][1]["max_new_tokens"] == 4 * 6
    # refused before anything loads
    assert "needs a draft model" in no_draft["error"] and no_draft["events"] == []
    assert "tokenizer" in no_tok["error"] and no_tok["events"] == []


def test_mtp_index_share(arms: Arms) -> None:
    cases = [{"seed": 0}, {"seed": 0, "share_caps": True}]
    stock = run_cases(arms.stock, "mtp_share.py", cases)
    off, caps_only, on, flag_only = run_cases(
        arms.patched,
        "mtp_share.py",
        cases
        + [
            {"seed": 0, "share_caps": True, "env": {"EXL3_OVL_MTP_INDEX_SHARE": "1"}},
            {"seed": 0, "env": {"EXL3_OVL_MTP_INDEX_SHARE": "1"}},
        ],
    )
    for p, s in ((off, stock[0]), (caps_only, stock[1]), (flag_only, stock[0])):
        assert {k: v for k, v in p.items() if k != "selection"} == {
            k: v for k, v in s.items() if k != "selection"
        }
    assert on["drafts"] == stock[1]["drafts"] and on["steps"] == [0, 1, 2, 0, 1, 2]
    # one fresh dict per round reaches every depth: empty at depth 0, holding depth 0's entry afterwards
    assert on["share_per_round"] == [[1, [0, 1, 1]], [1, [0, 1, 1]]]
    assert all("dsa_mtp_share" in keys for keys in on["keys"])
    sel = on["selection"]
    assert sel["available"] and sel["trials"] == 160 and sel["failures"] == [] and sel["depth0_identity"]


def test_mtp_index_share_keeps_the_graphed_step_at_depth_0(arms: Arms) -> None:
    """0019: depth 0 of a shared-selection MTP round still runs the graphed bc_mla step (as stock does at every
    depth) and its selection reaches the later depths, which take the dispatch path; without the share dict every
    depth is graphed, as in stock."""
    (stock,) = run_cases(arms.stock, "mla_bc_depth.py", [{"share": True}])
    off, on = run_cases(arms.patched, "mla_bc_depth.py", [{"share": False}, {"share": True}])
    assert [c["path"] for c in stock["calls"]] == ["graph"] * 3 and off == stock
    assert [c["path"] for c in on["calls"]] == ["graph", "dispatch", "dispatch"]
    # the graphed depth-0 selection (a static the next layer overwrites) is copied into the share dict
    assert on["share"] == {"3": [[0, 1, 2], [1000]]}
    assert [c.get("anchor") for c in on["calls"][1:]] == [[[0, 1, 2], [1000]]] * 2


def test_embed_on_device(arms: Arms) -> None:
    """--embed_on_device: the real Embedding module, placed by the loader's rule, stays on the device, so 0013's
    device-built verify input runs and a round has one host sync (stock and 0013 alone: two, at bsz 1)."""
    base = {"seed": 3, "bsz": 1, "block": 12, "rounds": 5, "corrupt": 8, "embed": "loader"}
    wide = {**base, "seed": 4, "bsz": 3, "block": 8}
    stock, stock3 = run_cases(arms.stock, "spec_round.py", [base, wide])
    off, alone, on, on3 = run_cases(
        arms.patched,
        "spec_round.py",
        [
            base,
            {**base, "env": ROUND},
            {**base, "env": ROUND, "embed_on_device": True},
            {**wide, "env": ROUND, "embed_on_device": True},
        ],
    )
    for doc in (off, alone, on):
        assert _same_outputs(stock, doc)
    assert _same_outputs(stock3, on3)
    # the loader's placement: system RAM for an unquantized table, unless the option keeps it on the device
    assert (
        stock["embed_table"]
        == off["embed_table"]
        == alone["embed_table"]
        == {"is_cuda": False, "caps": {"prefer_cpu": True, "x_cpu": False}}
    )
    assert on["embed_table"] == {"is_cuda": True, "caps": {"prefer_cpu": False, "x_cpu": False}}
    assert _spec_syncs(stock) == _spec_syncs(off) == _spec_syncs(alone) == [2] * 5
    assert _spec_syncs(on) == [1] * 5 and _spec_syncs(on3) == [1] * 5 and _spec_syncs(stock3) == [4] * 5
    assert on["forward_inputs"][-1] == "device"
    assert stock["forward_inputs"][-1] == alone["forward_inputs"][-1] == "host"
