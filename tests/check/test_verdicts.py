"""Speed verdicts that mean what they say: the paired log-ratio interval keeps its coverage (simulated), a ratio
whose interval spans 1.0 is inconclusive (never a pass), a speed gate refuses fewer than 5 repetitions, the
direction that is better is labelled, and the report carries the host's facts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from overlay.check import stats
from overlay.check.gates import check_speed_gate, finish, speed_gate
from overlay.check.host import cpu_model, host_facts, requirement_names
from overlay.check.measures import speed_block
from overlay.check.options import CheckOptions
from overlay.errors import CheckFailed, UsageError

REPO = Path(__file__).resolve().parents[2]


def _simulate(n: int, trials: int, rng: np.random.Generator, *, true_ratio: float = 1.07) -> np.ndarray:
    """Paired timing repetitions: a drift shared by both arms of one repetition (machine load) and independent
    multiplicative noise per run; returns [trials, 2, n] (candidate, reference)."""
    drift = rng.normal(0, 0.10, size=(trials, 1, n))
    noise = rng.normal(0, 0.04, size=(trials, 2, n))
    base = 100.0 * np.exp(drift + noise)
    base[:, 0, :] *= true_ratio
    return base


@pytest.mark.parametrize("n", [5, 8])
def test_log_ratio_interval_has_its_stated_coverage(n: int) -> None:
    rng = np.random.default_rng(7)
    true = 1.07
    runs = _simulate(n, 3000, rng, true_ratio=true)
    hits = 0
    for cand, ref in runs:
        r = stats.ratio_ci(cand, ref)
        hits += r["ci_low"] <= true <= r["ci_high"]
    coverage = hits / len(runs)
    assert 0.93 <= coverage <= 0.97, coverage  # stated: 95%


def test_the_old_percentile_bootstrap_of_medians_undercovers() -> None:
    """The simulation can tell: the method the check used before misses far more often than 5% at 3 reps."""
    rng = np.random.default_rng(11)
    true = 1.07
    runs = _simulate(3, 1500, rng, true_ratio=true)
    boot = np.random.default_rng(1)
    misses = 0
    for cand, ref in runs:
        picks = boot.integers(0, 3, size=(400, 3))
        ratios = np.median(cand[picks], axis=1) / np.median(ref[picks], axis=1)
        lo, hi = np.percentile(ratios, 2.5), np.percentile(ratios, 97.5)
        misses += not (lo <= true <= hi)
    assert misses / len(runs) > 0.15
    new_misses = sum(
        not (stats.ratio_ci(c, r)["ci_low"] <= true <= stats.ratio_ci(c, r)["ci_high"]) for c, r in runs
    )
    assert new_misses / len(runs) < 0.08


def test_ratio_with_one_repetition_has_no_interval_and_is_inconclusive() -> None:
    paired = stats.ratio_ci(
        [2.0, 1.0, 3.0], [1.0, 2.0, 1.0]
    )  # per-rep ratios 2, 0.5, 3: geometric mean 1.442
    assert paired["ratio"] == pytest.approx(3 ** (1 / 3)) and paired["ratio_of_medians"] == pytest.approx(2.0)
    r = stats.ratio_ci([2.0], [1.0])
    assert r["ratio"] == pytest.approx(2.0) and r["ci_low"] is None and r["ci_high"] is None
    assert stats.speed_verdict(r, higher_is_better=True) == "inconclusive"
    assert stats.fmt_ratio(r) == "2.000 [no interval]"


def test_verdict_is_inconclusive_when_the_interval_spans_one() -> None:
    spans = {"ratio": 1.02, "ci_low": 0.97, "ci_high": 1.08, "n": 5}
    assert stats.speed_verdict(spans, higher_is_better=True) == "inconclusive"
    up = {"ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3, "n": 5}
    assert stats.speed_verdict(up, higher_is_better=True) == "better"
    assert stats.speed_verdict(up, higher_is_better=False) == "worse"  # e.g. cold start took 20% longer


def test_speed_gate_never_passes_an_interval_that_spans_one() -> None:
    spans = {"ratio": 1.02, "ci_low": 0.97, "ci_high": 1.08, "n": 5, "verdict": "inconclusive"}
    g = speed_gate(spans, 0.95)  # even a no-regression budget below the low end
    assert g["passed"] is False and g["status"] == "inconclusive" and "INCONCLUSIVE" in g["detail"]
    ok = {"ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3, "n": 5, "verdict": "better"}
    assert speed_gate(ok, 1.05)["status"] == "pass"
    assert speed_gate(ok, 1.15)["status"] == "fail"


def test_speed_block_labels_direction_and_verdict() -> None:
    samples: dict[str, dict[str, list[float]]] = {
        "stock": {
            "decode_tok_s": [100, 101, 99, 100, 100],
            "prefill_tok_s": [],
            "decode_cpu_tok_s": [],
            "cold_start_s": [2.0, 2.1, 2.0, 1.9, 2.0],
        },
        "patched": {
            "decode_tok_s": [120, 122, 119, 121, 120],
            "prefill_tok_s": [],
            "decode_cpu_tok_s": [],
            "cold_start_s": [1.5, 1.6, 1.5, 1.45, 1.5],
        },
    }
    out = speed_block(samples, "patched", "stock")
    assert out["ratio"]["decode"]["better"] == "higher" and out["ratio"]["decode"]["verdict"] == "better"
    cold = out["ratio"]["cold_start"]
    assert (
        cold["better"] == "lower"
        and cold["unit"] == "s"
        and cold["verdict"] == "better"
        and cold["ratio"] < 1
    )
    assert "prefill" not in out["ratio"]  # no samples, no ratio


def test_speed_gate_refuses_fewer_than_five_repetitions() -> None:
    with pytest.raises(UsageError, match="at least 5 speed repetitions") as exc:
        check_speed_gate(CheckOptions(engine="x", reps=3, min_speedup=1.05))
    assert exc.value.return_code == 2 and "--reps 5" in (exc.value.tip or "")
    check_speed_gate(CheckOptions(engine="x", reps=3))  # no gate: reps are the user's choice
    check_speed_gate(CheckOptions(engine="x", reps=5, min_speedup=1.05))


def test_cli_refuses_a_speed_gate_at_three_reps_before_running(cli: Any) -> None:
    r = cli("--root", str(REPO), "check", "mlx-lm", "--reps", "3", "--min-speedup", "1.05")
    assert r.code == 2 and "at least 5 speed repetitions" in r.err and "Traceback" not in r.err


def test_only_inconclusive_gates_give_an_inconclusive_verdict_and_exit_4(tmp_path: Path) -> None:
    options = CheckOptions(engine="demo", json_path=tmp_path / "r.json", html_path=tmp_path / "r.html")
    manifest = SimpleNamespace(name="demo")
    report: dict[str, Any] = {
        "engine": "demo",
        "arms": {"stock": {"wheel": "a", "version": "1"}, "patched": {"wheel": "b", "version": "2"}},
        "series": {"class": "exact", "patches": []},
        "notes": [],
        "host": host_facts(),
    }
    gates = [
        {"subject": "series", "class": "exact", "gate": "greedy identical", "passed": True, "detail": "4/4"},
        speed_gate({"ratio": 1.01, "ci_low": 0.98, "ci_high": 1.05, "n": 5, "verdict": "inconclusive"}, 1.0),
    ]
    with pytest.raises(CheckFailed, match=r"1 gate\(s\) inconclusive \(none failed\)") as exc:
        finish(tmp_path, options, manifest, report, gates)  # type: ignore[arg-type]
    assert exc.value.return_code == 4
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["verdict"] == "inconclusive" and written["gates"][1]["status"] == "inconclusive"
    assert written["host"]["load_average_end"] is not None
    assert "inconclusive" in (tmp_path / "r.html").read_text()


def test_host_facts(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: X\nmodel name\t: Test CPU 9000 @ 3.0GHz\n\nprocessor\t: 1\n"
    )
    assert cpu_model(info) == "Test CPU 9000 @ 3.0GHz"
    facts = host_facts()
    assert facts["cores"] >= 1 and len(facts["load_average_start"]) == 3 and facts["python"]
    assert requirement_names(["mlx[cpu]==0.32.4", "numpy", "transformers>=5.7.0", "numpy<3"]) == [
        "mlx",
        "numpy",
        "transformers",
    ]


def test_chi_square_survival_matches_tables() -> None:
    assert stats.chi2_sf(3.841, 1) == pytest.approx(0.05, abs=2e-4)
    assert stats.chi2_sf(18.307, 10) == pytest.approx(0.05, abs=2e-4)
    assert stats.chi2_sf(6.635, 1) == pytest.approx(0.01, abs=1e-4)
    assert stats.chi2_sf(0.0, 4) == 1.0


def test_homogeneity_rejects_at_its_level_and_detects_a_shift() -> None:
    rng = np.random.default_rng(3)
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    rejections = 0
    trials = 400
    for _ in range(trials):
        a = rng.choice(5, size=200, p=p).tolist()
        b = rng.choice(5, size=200, p=p).tolist()
        rejections += stats.homogeneity(a, b)["p"] < 0.05
    assert 0.02 <= rejections / trials <= 0.09
    q = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    a = rng.choice(5, size=1500, p=p).tolist()
    b = rng.choice(5, size=1500, p=q).tolist()
    assert stats.homogeneity(a, b)["p"] < 1e-3
    assert stats.homogeneity([1, 1, 1], [1, 1, 1])["p"] == 1.0  # one category: cannot differ
