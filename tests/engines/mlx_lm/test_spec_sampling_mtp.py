"""Sampled (temp > 0) speculative decoding that drafts with the model's own MTP head: the emitted tokens are
distributed as serial sampling, and the head's drafts are accepted as often as rejection sampling should accept them.

Patches: 0022 (``draft_kind="mtp"``: stock has no MTP head, its sanitize drops the weights) and 0025 (rejection
sampling in the verify). Model: the trained ``qwen3_5-mtp`` of overlay.check.models (a hybrid Qwen3.5 target and an MTP
head trained against it; built locally, cached), so the target is rolled back after a rejection too (0017/0024).
Prompt: a JSON prefix of the built-in prompts, where the head is partly right (first-draft acceptance about 0.41 at
T = 0.7 and 0.32 at T = 1.0 with the filters: rejections in most cycles).

The MTP head drafts from the target's hidden state at the last processed token, so the first token of a generation
comes from a plain step and the first draft sits at output position 1. Each run generates three tokens with k = 2:
position 1 is the first draft (accepted, or the residual draw), position 2 the chained second draft, the target's
token after it, or the next cycle's after a rejection. The reference is exact (probes/spec_sampling.py): the stock arm
computes serial sampling's marginal distributions at positions 0, 1, 2 from stock's sampler definition (sequences
under 1e-7 not followed: at most 5e-4 of the mass left out); the patched arm computes the expected acceptance of the
first draft, ``sum over x0 of p0(x0) * sum(min(p1(.|x0), q1(.|x0)))`` with q1 the head's distribution after the
same processors and filters, from one uncached pass of the head. Checks (chi-square goodness of fit at ALPHA, cells
with an expected count under 5 pooled, 600 seeds per run):

- stock serial sampling passes at every position: the reference is right;
- patched MTP speculative sampling passes at every position, for T = 0.7 and for T = 1.0 with top-k, top-p, min-p
  and a repetition penalty; its first-draft acceptance is within 4.5 standard errors of the expected value and
  well above the exact-match verify's ``sum(p1 * q1)`` where the two differ;
- negative control: the same with a deliberately wrong residual (a rejected position resampled from p) FAILS at
  position 1 (1500 seeds; at T = 1.0 with the filters, where the head's q is far from p: at T = 0.7 on this prompt
  the wrong residual emits almost p, noncentrality 0.1 at 600 seeds, and no test could see it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_spec_sampling import ALPHA, CONFIGS, PROBE, RUNS, acceptance_ok, chi_square_p

from overlay.check.envs import Arms

POSITIONS = 3
PROMPT_TEXT = '{"city": "rome", "temp"'
PRUNE = 1e-7
WRONG_RUNS = 1500


@pytest.fixture(scope="module")
def model(arms: Arms, repo_root: Path) -> str:
    tinymodels = pytest.importorskip("overlay.check.models")
    return str(tinymodels.build("qwen3_5-mtp", root=repo_root, python=arms.stock.python))


def _payload(model: str, **extra: Any) -> dict[str, Any]:
    return {
        "target": model,
        "draft": None,
        "prompt_text": PROMPT_TEXT,
        "k": 2,
        "runs": RUNS,
        "positions": POSITIONS,
        "prune": PRUNE,
        "configs": CONFIGS,
        **extra,
    }


@pytest.fixture(scope="module")
def results(arms: Arms, model: str) -> dict[str, Any]:
    ref = arms.stock.run_json(PROBE, _payload(model, reference=True, mode="serial"))
    out = {"reference": ref["reference"], "serial": ref}
    out["mtp"] = arms.patched.run_json(PROBE, _payload(model, mode="mtp_reference", runs=1))["mtp"]
    out["spec"] = arms.patched.run_json(PROBE, _payload(model, mode="spec"))
    out["wrong"] = arms.patched.run_json(
        PROBE, _payload(model, mode="wrong", configs=CONFIGS[1:], runs=WRONG_RUNS)
    )
    assert out["spec"]["prompt"] == ref["prompt"] == out["wrong"]["prompt"]
    return out


@pytest.mark.long  # the trained model (built once, ~2 min) and four sampling runs: ~4 minutes on 2 cores
def test_reference_matches_stock_serial_sampling(results: dict[str, Any]) -> None:
    for cfg in CONFIGS:
        ref = results["reference"][cfg["name"]]
        for pos in range(POSITIONS):
            assert sum(ref[f"p{pos}"]) > 1 - 1e-3, "the reference left too much mass out"
            stat, df, p = chi_square_p(results["serial"]["counts"][cfg["name"]][pos], ref[f"p{pos}"])
            assert p > ALPHA, (
                f"{cfg['name']} position {pos}: stock serial vs reference chi2={stat:.1f} df={df}"
            )


@pytest.mark.long  # the trained model (built once, ~2 min) and four sampling runs: ~4 minutes on 2 cores
def test_mtp_speculative_sampling_matches_serial(results: dict[str, Any]) -> None:
    spec = results["spec"]
    for cfg in CONFIGS:
        name = cfg["name"]
        ref, mtp = results["reference"][name], results["mtp"][name]
        assert 0.2 < mtp["accept_min"] < 0.95, "the head must be partly right for the test to mean anything"
        for pos in range(POSITIONS):
            stat, df, p = chi_square_p(spec["counts"][name][pos], ref[f"p{pos}"])
            assert df >= 3
            assert p > ALPHA, (
                f"{name} position {pos}: MTP speculative vs serial chi2={stat:.1f} df={df} p={p:.2e}"
            )
        n = spec["first_drafted"][name]
        assert n == RUNS
        assert acceptance_ok(spec["first_accept"][name], n, mtp["accept_min"]), (
            name,
            spec["first_accept"][name] / n,
            mtp["accept_min"],
        )
    # Where q is far from p the exact-match verify would accept much less (T = 1.0 with the filters: 0.18).
    name = CONFIGS[1]["name"]
    assert results["mtp"][name]["accept_exact"] < results["mtp"][name]["accept_min"] - 0.1
    assert spec["first_accept"][name] / RUNS > results["mtp"][name]["accept_exact"] + 0.05


@pytest.mark.long  # the trained model (built once, ~2 min) and four sampling runs: ~4 minutes on 2 cores
def test_wrong_residual_is_detected(results: dict[str, Any]) -> None:
    name = CONFIGS[1]["name"]
    ref = results["reference"][name]
    stat, df, p = chi_square_p(results["wrong"]["counts"][name][0], ref["p0"])
    assert p > ALPHA, "position 0 is a plain step: no draft, no residual"
    stat, df, p = chi_square_p(results["wrong"]["counts"][name][1], ref["p1"])
    assert p < ALPHA, f"a residual drawn from p must fail the test (chi2={stat:.1f} df={df} p={p:.2e})"
