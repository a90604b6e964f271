"""cuda-graph patches: work 0.5.23 leaves eager between graph replays, made capturable (stock vs patched, CPU).

Capture and replay need a GPU (scripts/device/sglang_check.py); here the capturable code is checked for equality
with the stock code on the same inputs. Where SGLang has a Triton version of the stock kernel, the probe also runs
it through the Triton interpreter, so "stock" is upstream's kernel, not only the CPU test backend.
"""

from __future__ import annotations

from sglang_support import UnitCases, assert_noop_and_exact


def test_draft_topk1_select(units: UnitCases) -> None:
    """0003: the in-graph topk==1 selection equals the stock eager argmax + ones (ties included)."""
    stock, patched = units.case("draft_topk1_select")
    assert_noop_and_exact(stock, patched)


def test_chain_greedy_verify(units: UnitCases) -> None:
    """0004: tensor-only chain verify equals the tree-walk verify (CPU op and upstream Triton kernel)."""
    stock, patched = units.case("chain_verify")
    assert stock["triton_ref"] == stock["ref"], "CPU test backend disagrees with upstream's Triton tree walk"
    assert_noop_and_exact(stock, patched)


def test_chain_tree(units: UnitCases) -> None:
    """0005: the closed-form chain tree equals the tree-construction kernel for FULL_MASK and QLEN_ONLY."""
    stock, patched = units.case("chain_tree")
    assert stock["triton_ref"] == stock["ref"], "CPU test backend disagrees with upstream's Triton tree kernel"
    assert_noop_and_exact(stock, patched)


def test_chain_tree_preallocated_verify_mask(units: UnitCases) -> None:
    """0005 in the engine's draft tail (build_eagle_verify_input): the target backend owns a VerifyMask buffer sized
    for max_bs (QLEN_ONLY as FA3/FlashMLA/trtllm-MLA allocate it, and FULL_MASK) and the batch is smaller; the
    closed-form tree must write the same outputs as stock, not fail on the oversized buffer."""
    stock, patched = units.case("chain_tree_verify_mask")
    assert all(isinstance(v, list) for v in stock["ref"].values()), stock["ref"]
    assert_noop_and_exact(stock, patched)


def test_graph_greedy_verify_epilogue(units: UnitCases) -> None:
    """0018 with --speculative-adaptive: every target verify graph of the startup runner (3 steps) and of the
    adaptive runners (2 and 5 steps: other draft widths) is captured through capture_tail_hooks; per step the current
    runner is swapped as apply_runtime_state does and replayed, then run_eagle_verify's attach and the real
    eagle_sample run. Every graph step must use the in-graph results of the runner that replayed and equal the stock
    eager tail on the same logits (today's patch returned stale or wrong-width results after a swap); an eager
    verify uses none, and logits with host-side edits never take the graph results."""
    stock, patched = units.case("graph_verify_epilogue")
    assert_noop_and_exact(stock, patched)
    assert patched["graph_used"] == [True] * 7 + [False]
    usable = patched["usable"]
    assert usable.pop("plain") is True
    assert not any(usable.values()), usable
