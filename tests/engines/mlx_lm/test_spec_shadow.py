"""Adaptive drafting learns from the drafter's catch-up (patch generate: adaptive drafting learns from the drafter's
catch-up, without verifying). Stock has no adaptive drafting; the reference is the series without this patch.

After a run of serial steps the drafter processes the tokens it did not see before it drafts again (stock does the
same). Its logits there say whether its drafts would have been accepted: the controller gets that evidence
(``record_shadow``) and drafts a checking cycle only when it predicts a speedup (``probe_pays``).

- Decisions, simulated (probes/spec_shadow_sim.py, the scenarios of test_spec_controller.py, seeded, 30 % one-sided
  timing noise, nothing timed here; a caught-up token costs 1/32 of a draft step: measured on the bench's tiny
  drafter, 0.005 ms per token of a 100-token catch-up against a 0.22 ms draft step): where drafting cannot pay the
  generator drafts fewer cycles than without the evidence (a never-right drafter: none per generation, against 4-16
  without the evidence; before any verify is timed a check is drafted only if the evidence's upper confidence bound
  on the acceptance predicts a speedup with a verify cost between its bounds), and loses less to serial decoding
  than without it (median; at most 2 % in every run, the catch-up of a drafter costing 0.6 of a target step
  included); where it pays it keeps >= 85 % of the best fixed draft length (median >= 90 %), as before; it still
  turns drafting off on a collapse and back on on a recovery.
- Real models (the tiny fp32 models of probes/spec_build.py): with a never-right drafter and a good one, greedy and
  T = 0.7, the adaptive generator's greedy tokens equal stock serial decoding (lossless), and the evidence is what
  the drafter predicts: none of the never-right drafter's tokens, most of the self-drafter's. Counted (the
  generator's own cycle count, nothing timed): the never-right drafter drafts no cycle in 96 tokens, the
  self-drafter drafts its first cycle right after the 8 warm-up tokens.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from test_spec_controller import CANT_PAY, PAYS, SHIFTS

from overlay.check.envs import Arms

PROBES = Path(__file__).parent / "probes"
SIM = PROBES / "spec_shadow_sim.py"
RUN = PROBES / "spec_shadow_run.py"
SEEDS = range(8)
NOISE = 0.3


@pytest.fixture(scope="module")
def simulated(arms: Arms) -> dict[str, dict[str, list[dict[str, Any]]]]:
    scenarios = []
    for group in (CANT_PAY, PAYS, SHIFTS):
        for name, sc in group.items():
            for shadow in (False, True):
                scenarios += [
                    {
                        "id": f"{name}/{shadow}/{seed}",
                        "seed": seed,
                        "noise": NOISE,
                        "shadow": shadow,
                        "catch_up": sc["draft"] / 32,
                        **sc,
                    }
                    for seed in SEEDS
                ]
    result = arms.patched.run_json(SIM, {"scenarios": scenarios})["scenarios"]
    out: dict[str, dict[str, list[dict[str, Any]]]] = {"with": {}, "without": {}}
    for key, value in result.items():
        name, shadow, _ = key.split("/")
        out["with" if shadow == "True" else "without"].setdefault(name, []).append(value)
    return out


def test_shadow_evidence_stops_useless_cycles(simulated: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    for name in CANT_PAY:
        with_, without = simulated["with"][name], simulated["without"][name]
        cycles = [r["cycles"] for r in with_]
        assert sum(r["cycles"] for r in without) > sum(cycles), (name, "the evidence changed nothing")
        if CANT_PAY[name]["alpha"] == [
            [0, 0.0]
        ]:  # a never-right drafter: no cycle at all, not even one timing the verify
            assert max(cycles) == 0, (name, cycles)
        cost = [1.0 - r["speedup"] for r in with_]
        assert statistics.median(cost) <= statistics.median(1.0 - r["speedup"] for r in without) + 1e-9, name
        assert max(cost) <= 0.02, (name, cost)
    # The long useless run: every check after the first decision is answered by the evidence alone.
    assert all(r["skipped"] >= 2 and r["cycles"] == 0 for r in simulated["with"]["useless"])


def test_shadow_keeps_what_pays(simulated: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    for name in PAYS:
        kept = [r["speedup"] / r["best_fixed"] for r in simulated["with"][name]]
        assert min(kept) >= 0.85 and statistics.median(kept) >= 0.9, (name, kept)
    # The thresholds of test_spec_controller.py.
    collapse = [r["per_phase"] for r in simulated["with"]["collapse"]]
    assert statistics.median(p[0] for p in collapse) >= 1.7, collapse
    assert statistics.median(p[1] for p in collapse) >= 0.93, collapse
    recover = [r["per_phase"] for r in simulated["with"]["recover"]]
    assert statistics.median(p[0] for p in recover) >= 0.99, recover
    assert statistics.median(p[1] for p in recover) >= 1.7, recover


@pytest.fixture(scope="module")
def real_runs(arms: Arms, models: dict[str, str]) -> dict[str, Any]:
    result: dict[str, Any] = arms.patched.run_json(
        RUN,
        {
            "target": models["qwen3"],
            "drafters": {"never": models["qwen3-random"], "self": models["qwen3"]},
            "tokens": 96,
        },
    )
    return result


def test_shadow_on_real_models_is_lossless(
    arms: Arms, models: dict[str, str], real_runs: dict[str, Any]
) -> None:
    result = real_runs
    stock = arms.stock.run_json(RUN, {"target": models["qwen3"], "drafters": {}, "tokens": 96})
    for name in ("never", "self"):
        greedy = result["runs"][name]["0.0"]
        assert greedy["tokens"] == stock["serial"]["0.0"], name
        assert greedy["shadow"], f"{name}: no catch-up evidence was recorded"
    never = [v for r in result["runs"]["never"].values() for v in r["shadow"]]
    self_ = list(result["runs"]["self"]["0.0"]["shadow"])
    assert sum(never) <= 0.1 * len(never), never
    assert sum(self_) >= 0.9 * len(self_), self_
    assert result["runs"]["never"]["0.7"]["n"] == 96


def test_never_right_drafter_drafts_no_cycle(real_runs: dict[str, Any]) -> None:
    """Counted, not timed: before any verify is timed the check is decided by the catch-up evidence alone (its upper
    confidence bound on the acceptance, a verify cost between its bounds), so a drafter that agrees with none of the
    serial tokens never drafts, while one that agrees drafts right after the 8 warm-up tokens, as before."""
    for temp in ("0.0", "0.7"):
        never = real_runs["runs"]["never"][temp]
        assert never["cycles"] == 0, (temp, never["cycles"], never["first_cycle_after"])
        assert never["first_cycle_after"] is None, temp
        self_ = real_runs["runs"]["self"][temp]
        assert self_["cycles"] >= 1, temp
        assert self_["first_cycle_after"] == 8, (temp, self_["first_cycle_after"])
