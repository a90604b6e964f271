"""0029 on real models: one stalled verify cycle no longer switches adaptive drafting off (the series up to 0028 vs the
whole series). Long: two arms, ~1 minute on the 2-core machine.

The pair is scripts/bench_mlx.py's ``heavy+draft`` (drafting pays), greedy, k = 3, two prompts x 96 tokens; the
first verify cycle of each generation sleeps 0.3 s in the target's forward (probes/spec_stall.py), as a burst of other
load adds to one cycle. Up to 0028 the controller takes that cycle's time as the cost of verifying and decodes nearly
all the rest serially; with 0029 it counts a stall and drafts on. Outputs equal ``generate_step``'s greedy tokens in
both. Times are measured by scripts/bench_mlx_stall.py, not asserted here; the counts below follow from the decisions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check import models as tinymodels
from overlay.check.envs import arms_for

pytestmark = pytest.mark.long
REPO = Path(__file__).resolve().parents[3]
PROBE = Path(__file__).parent / "probes" / "spec_stall.py"
TOKENS = 96


@pytest.fixture(scope="module")
def stalled() -> dict[str, dict[str, Any]]:
    arms = {"0028": arms_for(REPO, "mlx-lm", upto=28).patched, "series": arms_for(REPO, "mlx-lm").patched}
    python = arms["series"].python
    payload = {
        "target": str(tinymodels.build("llama-heavy", root=REPO, python=python)),
        "draft": str(tinymodels.build("llama-draft", root=REPO, python=python)),
        "prompts": [tinymodels.PROMPTS[c][0] for c in ("code", "prose")],
        "max_tokens": TOKENS,
        "k": 3,
        "stall_cycle": 0,
        "stall_seconds": 0.3,
    }
    return {name: arm.run_json(PROBE, payload) for name, arm in arms.items()}


def test_outputs_equal_serial_greedy(stalled: dict[str, dict[str, Any]]) -> None:
    for doc in stalled.values():
        assert [r["tokens"] for r in doc["runs"]] == doc["serial_tokens"]


def test_a_stalled_cycle_leaves_drafting_on(stalled: dict[str, dict[str, Any]]) -> None:
    before, series = stalled["0028"]["runs"], stalled["series"]["runs"]
    # the premise: up to 0028 the stall turns drafting off for (nearly) the rest of the generation
    assert all(r["serial"] > TOKENS // 2 and r["stalls"] is None for r in before), before
    assert all(r["stalls"] >= 1 for r in series), series
    assert all(r["serial"] < TOKENS // 4 and r["cycles"] > 10 for r in series), series
