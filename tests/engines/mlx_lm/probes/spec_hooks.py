"""Hooks the speculative-decoding probes put into the patched mlx-lm (runs inside an arm, never imported by overlay).

Kept out of spec_common.py, whose bytes key the cached tiny models.
"""

from __future__ import annotations

from typing import Any


def without_step_capture() -> Any:
    """Make the gated-delta ops path ignore per-step state recording (the rollback falls back to a replay: restore
    the snapshot taken before the verify, replay the accepted tokens). Returns the function that undoes it."""
    import mlx_lm.models.gated_delta as gd

    original = gd.gated_delta_ops

    def ops(
        q: Any,
        k: Any,
        v: Any,
        g: Any,
        beta: Any,
        state: Any = None,
        mask: Any = None,
        step_states: Any = None,
    ) -> Any:
        return original(q, k, v, g, beta, state, mask)

    gd.gated_delta_ops = ops
    return lambda: setattr(gd, "gated_delta_ops", original)
