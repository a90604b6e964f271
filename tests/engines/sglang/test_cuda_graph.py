"""cuda-graph patches: work 0.5.23 leaves eager between graph replays, moved into the captured graph (stock vs
patched, CPU).

Capture and replay need a GPU (scripts/device/sglang_check.py); here the code the hook captures runs in the engine's
order (capture, runner swaps, replays) against the stock eager path on the same inputs, and the launches of both are
counted (aten ops, as the mechanism census counts them).
"""

from __future__ import annotations

import pytest
from sglang_support import UnitCases, assert_noop_and_exact


@pytest.mark.long  # ~100 s of unit runs in both arms (stop 29: the default suite at 28 minutes on 2 cores)
def test_graph_greedy_verify_epilogue(units: UnitCases) -> None:
    """0011 (SGLANG_OPT_GRAPH_GREEDY_VERIFY) with --speculative-adaptive: every target verify graph of the startup
    runner (3 steps) and of the adaptive runners (2 and 5 steps: other draft widths) is captured through
    capture_tail_hooks; per step the current runner is swapped as apply_runtime_state does and replayed, then run_eagle_verify's attach and the real
    eagle_sample run. Every graph step must use the in-graph results of the runner that replayed and equal the stock
    eager tail on the same logits (today's patch returned stale or wrong-width results after a swap); an eager
    verify uses none, and logits with host-side edits never take the graph results."""
    stock, patched = units.case("graph_verify_epilogue")
    assert_noop_and_exact(stock, patched)
    assert patched["graph_used"] == [True] * 7 + [False]
    usable = patched["usable"]
    assert usable.pop("plain") is True
    assert not any(usable.values()), usable
    # The mechanism (eager-launches decreases in spec-verify-step): the eager work between the verify replay and the
    # commit (run_eagle_verify's attach + eagle_sample; the tree-verify kernel counted once), stock vs patched.
    stock_ops, patched_ops = stock["eager_launches"], patched["eager_launches"]
    assert stock_ops[0] == ["zeros", "full", "argmax", "verify_tree_greedy", "add"], stock_ops[0]
    for step, used in enumerate(patched["graph_used"]):
        if used:
            assert len(patched_ops[step]) < len(stock_ops[step]), (step, stock_ops[step], patched_ops[step])
            assert "argmax" not in patched_ops[step] and "verify_tree_greedy" not in patched_ops[step]
        else:
            assert patched_ops[step] == stock_ops[step], (step, patched_ops[step])
    # In the graph: the stock tail itself (zero/fill the static outputs, argmax, the stock kernel), not a re-implementation.
    steady = [
        ops for ops in patched["graph_launches"] if "arange" not in ops
    ]  # a width's first capture allocates
    assert steady and all(ops == ["zero_", "fill_", "argmax", "verify_tree_greedy"] for ops in steady), steady
