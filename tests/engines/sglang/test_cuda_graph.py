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


def test_graph_greedy_verify_epilogue(units: UnitCases) -> None:
    """0018: the verify-graph epilogue's computation (argmax + chain verify on padded graph sizes) equals the stock
    eager tail on the real rows; it is used only for captured graph sizes and for logits without host edits."""
    stock, patched = units.case("graph_verify_epilogue")
    assert_noop_and_exact(stock, patched)
    assert patched["ready"] == [True, False, False]
    usable = patched["usable"]
    assert usable.pop("plain") is True
    assert not any(usable.values()), usable
