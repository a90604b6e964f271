"""Sampled (temp > 0) speculative decoding on a hybrid (gated-delta + attention, ``ArraysCache``) target: the emitted
tokens are distributed as serial sampling, whichever way the target is rolled back after a rejection.

Patches: 0017 (speculative decoding for hybrid targets: stock refuses them, "requires a trimmable prompt cache"),
0023 (the replay folded into the next verify), 0024 (per-token gated-delta states), 0025 (rejection sampling).
Target: the tiny fp32 Qwen3.5 ``hybrid`` of probes/spec_build.py; drafter: the same weights with 2 % relative noise
(first-draft acceptance about 0.69 at T = 0.7: rejections, and so rollbacks, in a third of the first cycles).

A rollback only matters for the tokens after it, so each run generates three tokens with k = 2: position 0 comes
from the first verify, positions 1 and 2 from the first verify (drafts accepted) or from a later cycle after a
rollback (a rejection at the first or the second draft). The reference is exact (probes/spec_sampling.py, stock arm):
the marginal distributions of serial sampling at positions 0, 1, 2 from stock's sampler definition. Checks, each a
chi-square goodness-of-fit test at ALPHA (cells with an expected count under 5 pooled), 600 seeds per run:

- stock serial sampling passes at every position: the reference is right;
- patched speculative sampling passes at every position for T = 0.7 and for T = 1.0 with top-k, top-p, min-p and a
  repetition penalty, with the rollback of the CPU ops path (the per-token states of 0024) and with the generic one
  (restore the snapshot taken before the verify, the accepted tokens replayed in front of the next verify: 0017 +
  0023, the path Metal's gated-delta kernel takes); its first-draft acceptance is within 4.5 standard errors of
  ``sum(min(p, q))``;
- negative control: a rollback that restores the attention caches but leaves the recurrent state as the rejected
  drafts left it FAILS at position 1 (the test sees a wrong rollback).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_spec_sampling import ALPHA, CONFIGS, PROBE, PROMPT, RUNS, acceptance_ok, chi_square_p, noisy_drafter

from overlay.check.envs import Arms

POSITIONS = 3


@pytest.fixture(scope="module")
def drafter(arms: Arms, models: dict[str, str]) -> str:
    return noisy_drafter(arms, models["hybrid"], "qwen3_5", seed=12, noise=0.02)


def _payload(models: dict[str, str], draft: str, **extra: Any) -> dict[str, Any]:
    return {
        "target": models["hybrid"],
        "draft": draft,
        "prompt": PROMPT,
        "k": 2,
        "runs": RUNS,
        "positions": POSITIONS,
        "configs": CONFIGS,
        **extra,
    }


@pytest.fixture(scope="module")
def results(arms: Arms, models: dict[str, str], drafter: str) -> dict[str, Any]:
    ref = arms.stock.run_json(PROBE, _payload(models, drafter, reference=True, mode="serial"))
    out = {"reference": ref["reference"], "serial": ref}
    out["steps"] = arms.patched.run_json(PROBE, _payload(models, drafter, mode="spec"))
    out["replay"] = arms.patched.run_json(PROBE, _payload(models, drafter, mode="spec", no_step_capture=True))
    out["stale"] = arms.patched.run_json(
        PROBE, _payload(models, drafter, mode="stale_state", no_step_capture=True, configs=CONFIGS[:1])
    )
    return out


@pytest.mark.long  # four sampling runs of 600 seeds: ~4 minutes on 2 cores; scripts/test_long.sh
def test_reference_matches_stock_serial_sampling(results: dict[str, Any]) -> None:
    for cfg in CONFIGS:
        ref = results["reference"][cfg["name"]]
        for pos in range(POSITIONS):
            stat, df, p = chi_square_p(results["serial"]["counts"][cfg["name"]][pos], ref[f"p{pos}"])
            assert p > ALPHA, (
                f"{cfg['name']} position {pos}: stock serial vs reference chi2={stat:.1f} df={df}"
            )


@pytest.mark.long  # four sampling runs of 600 seeds: ~4 minutes on 2 cores; scripts/test_long.sh
@pytest.mark.parametrize("rollback", ["steps", "replay"])
def test_hybrid_speculative_sampling_matches_serial(results: dict[str, Any], rollback: str) -> None:
    run = results[rollback]
    for cfg in CONFIGS:
        name = cfg["name"]
        ref = results["reference"][name]
        assert 0.2 < ref["accept_min"] < 0.95, "the drafter must be partly right for rollbacks to happen"
        for pos in range(POSITIONS):
            stat, df, p = chi_square_p(run["counts"][name][pos], ref[f"p{pos}"])
            assert df >= 3
            assert p > ALPHA, f"{rollback} {name} position {pos}: chi2={stat:.1f} df={df} p={p:.2e}"
        assert run["first_drafted"][name] == RUNS
        assert acceptance_ok(run["first_accept"][name], RUNS, ref["accept_min"]), (
            rollback,
            name,
            run["first_accept"][name] / RUNS,
            ref["accept_min"],
        )


@pytest.mark.long  # four sampling runs of 600 seeds: ~4 minutes on 2 cores; scripts/test_long.sh
def test_stale_recurrent_state_is_detected(results: dict[str, Any]) -> None:
    name = CONFIGS[0]["name"]
    ref = results["reference"][name]
    stat, df, p = chi_square_p(results["stale"]["counts"][name][0], ref["p0"])
    assert p > ALPHA, "position 0 comes from the first verify, before any rollback"
    stat, df, p = chi_square_p(results["stale"]["counts"][name][1], ref["p1"])
    assert p < ALPHA, f"a rollback that keeps the rejected drafts' state must fail (chi2={stat:.1f} df={df})"
