"""Lossless speculative (rejection) sampling at temp > 0: the emitted tokens are distributed as serial sampling.

Patch: generate: speculative (rejection) sampling in the verify step. Models: the tiny fp32 ``qwen3`` target of
probes/spec_build.py and a drafter made from it with 15 % relative weight noise (partial acceptance: the verify
accepts some drafts and resamples others, so every branch of the algorithm matters). Probe: probes/spec_sampling.py.

The reference is exact, not sampled: the stock arm computes the distribution serial sampling draws from at output
positions 0 and 1 (position 1 as the marginal over every first token), from stock's sampler definition (logits
processors, log-softmax, the filters top-p -> min-p -> top-k, the temperature) with stock's filter functions. It
never calls the patch. Checks, each a chi-square goodness-of-fit test at significance ALPHA (cells with an expected
count under 5 pooled):

- stock serial sampling (``generate_step``, one seed per run) passes: the reference is right;
- patched ``speculative_generate_step`` (one seed per run, k = 2) passes at both positions, for temp 0.7 and for
  temp 1.0 with top-k, top-p, min-p and a repetition penalty; its first-draft acceptance is within 4.5 standard errors
  of ``sum(min(p, q))``;
- the same run with a deliberately wrong residual (a rejected position resampled from p) FAILS (the test has power);
- ``speculative_accept`` itself, vectorised over 50 000 independent copies of position 0: passes, and its acceptance
  rate is within 4.5 standard errors of ``sum(min(p, q))``; the wrong residual fails;
- exact-match acceptance (the sampler hidden behind a plain function, which is what every sampler got before the
  patch): also passes, it was lossless too, but its acceptance is ``sum(p * q)``, far below ``sum(min(p, q))``.

At temp 0 the greedy path is unchanged; the speculative tests (test_spec_*.py) keep it identical to stock serial
decoding.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from overlay.check import stats
from overlay.check.envs import Arms

PROBE = Path(__file__).parent / "probes" / "spec_sampling.py"
PROMPT = [217, 162, 130, 69, 79]
RUNS = 600
UNIT_ROWS = 50_000
ALPHA = 1e-3
CONFIGS = [
    {"name": "t0.7", "temp": 0.7},
    {
        "name": "t1.0+filters+penalty",
        "temp": 1.0,
        "top_k": 20,
        "top_p": 0.95,
        "min_p": 0.02,
        "repetition_penalty": 1.3,
    },
]


def chi_square_p(counts: list[int], probs: list[float]) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of observed ``counts`` against the exact ``probs``
    (overlay.check.stats.goodness_of_fit)."""
    r = stats.goodness_of_fit(counts, probs)
    return r["chi2"], r["df"], r["p"]


def test_chi_square_helper_matches_known_quantiles() -> None:
    # chi2(df=1) 0.999 quantile 10.828; chi2(df=10) 0.95 quantile 18.307.
    assert abs(stats.chi2_sf(10.828, 1) - 1e-3) < 2e-5
    assert abs(stats.chi2_sf(18.307, 10) - 0.05) < 2e-4


def noisy_drafter(arms: Arms, target: str, arch: str, seed: int, noise: float) -> str:
    """A drafter built next to ``target``: its weights with relative noise ``noise`` (seeded), in the stock arm."""
    path = f"{target}-noise{round(noise * 100):02d}"
    build = {"path": path, "arch": arch, "seed": seed, "like": target, "noise": noise}
    arms.stock.run_json(PROBE, {"build": build, "target": target, "draft": None})
    return path


@pytest.fixture(scope="module")
def drafter(arms: Arms, models: dict[str, str]) -> str:
    return noisy_drafter(arms, models["qwen3"], "qwen3", seed=11, noise=0.15)


def _payload(models: dict[str, str], draft: str, **extra: Any) -> dict[str, Any]:
    return {
        "target": models["qwen3"],
        "draft": draft,
        "prompt": PROMPT,
        "k": 2,
        "runs": RUNS,
        "configs": CONFIGS,
        "unit_rows": UNIT_ROWS,
        **extra,
    }


@pytest.fixture(scope="module")
def results(arms: Arms, models: dict[str, str], drafter: str) -> dict[str, Any]:
    ref = arms.stock.run_json(PROBE, _payload(models, drafter, reference=True, mode="serial"))
    out = {"reference": ref["reference"], "serial": ref}
    out["unit"] = arms.patched.run_json(PROBE, _payload(models, drafter, mode="unit"))["unit"]
    out["spec"] = arms.patched.run_json(PROBE, _payload(models, drafter, mode="spec"))
    one = [CONFIGS[0]]
    out["wrong"] = arms.patched.run_json(PROBE, _payload(models, drafter, mode="wrong", configs=one))
    out["exact"] = arms.patched.run_json(
        PROBE, _payload(models, drafter, mode="exact", configs=one, runs=RUNS // 2)
    )
    return out


def acceptance_ok(accepted: int, n: int, expected: float) -> bool:
    se = math.sqrt(max(expected * (1 - expected), 1e-9) / n)
    return abs(accepted / n - expected) <= 4.5 * se


@pytest.mark.long  # the sampling runs behind `results`: ~1.5 minutes on 2 cores; scripts/test_long.sh
def test_reference_matches_stock_serial_sampling(results: dict[str, Any]) -> None:
    for cfg in CONFIGS:
        ref = results["reference"][cfg["name"]]
        for pos in (0, 1):
            stat, df, p = chi_square_p(results["serial"]["counts"][cfg["name"]][pos], ref[f"p{pos}"])
            assert p > ALPHA, (
                f"{cfg['name']} position {pos}: stock serial vs reference chi2={stat:.1f} df={df}"
            )


@pytest.mark.long  # the sampling runs behind `results`: ~1.5 minutes on 2 cores; scripts/test_long.sh
def test_speculative_sampling_matches_serial_distribution(results: dict[str, Any]) -> None:
    for cfg in CONFIGS:
        name = cfg["name"]
        ref = results["reference"][name]
        assert 0.2 < ref["accept_min"] < 0.95, (
            "the drafter must be partly right for the test to mean anything"
        )
        for pos in (0, 1):
            stat, df, p = chi_square_p(results["spec"]["counts"][name][pos], ref[f"p{pos}"])
            assert df >= 3
            assert p > ALPHA, (
                f"{name} position {pos}: speculative vs serial chi2={stat:.1f} df={df} p={p:.2e}"
            )
        n = results["spec"]["first_drafted"][name]
        assert n == RUNS
        assert acceptance_ok(results["spec"]["first_accept"][name], n, ref["accept_min"]), (
            name,
            results["spec"]["first_accept"][name] / n,
            ref["accept_min"],
        )


@pytest.mark.long  # the sampling runs behind `results`: ~1.5 minutes on 2 cores; scripts/test_long.sh
def test_wrong_residual_is_detected(results: dict[str, Any]) -> None:
    name = CONFIGS[0]["name"]
    ref = results["reference"][name]
    stat, df, p = chi_square_p(results["wrong"]["counts"][name][0], ref["p0"])
    assert p < ALPHA, f"a residual drawn from p must fail the test (chi2={stat:.1f} df={df} p={p:.2e})"


@pytest.mark.long  # the sampling runs behind `results`: ~1.5 minutes on 2 cores; scripts/test_long.sh
def test_speculative_accept_vectorised(results: dict[str, Any]) -> None:
    for cfg in CONFIGS:
        name = cfg["name"]
        ref = results["reference"][name]
        right, wrong = results["unit"][name]["right"], results["unit"][name]["wrong"]
        stat, df, p = chi_square_p(right["counts"], ref["p0"])
        assert p > ALPHA, f"{name}: speculative_accept vs p chi2={stat:.1f} df={df} p={p:.2e}"
        assert acceptance_ok(right["accepted"], UNIT_ROWS, ref["accept_min"]), (
            name,
            right["accepted"] / UNIT_ROWS,
            ref["accept_min"],
        )
        stat, df, p = chi_square_p(wrong["counts"], ref["p0"])
        assert p < 1e-12, f"{name}: the wrong residual passed (chi2={stat:.1f} df={df})"


@pytest.mark.long  # the sampling runs behind `results`: ~1.5 minutes on 2 cores; scripts/test_long.sh
def test_exact_match_acceptance_was_lossless_but_low(results: dict[str, Any]) -> None:
    name = CONFIGS[0]["name"]
    ref = results["reference"][name]
    exact = results["exact"]
    for pos in (0, 1):
        stat, df, p = chi_square_p(exact["counts"][name][pos], ref[f"p{pos}"])
        assert p > ALPHA, f"exact-match position {pos} chi2={stat:.1f} df={df}"
    n = exact["first_drafted"][name]
    assert acceptance_ok(exact["first_accept"][name], n, ref["accept_exact"])
    assert ref["accept_exact"] < ref["accept_min"] - 0.2
    assert results["spec"]["first_accept"][name] / RUNS > exact["first_accept"][name] / n + 0.2
