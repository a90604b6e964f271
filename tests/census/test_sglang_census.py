"""The SGLang census task (workers/sglang_worker.py task_census, counted in the scheduler process by
workers/sglang_census_hook.py) on the CPU engine path, stock arm: real engine, tiny random llama."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arm, arms_for
from overlay.engines import get_adapter

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "engines" / "sglang"))
pytestmark = [pytest.mark.slow, pytest.mark.long]  # minutes on 2 cores: scripts/test_long.sh


@pytest.fixture(scope="module")
def stock() -> Arm:
    return arms_for(REPO, "sglang").stock


@pytest.fixture(scope="module")
def model() -> Path:
    from engines.sglang.sglang_support import tiny_model

    path: Path = tiny_model()
    return path


def census(arm: Arm, model: Path, scenario: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    run_arm = arm.with_env(env)
    return get_adapter("sglang").run(
        run_arm, {"task": "census", "model": str(model), "scenario": scenario, "steps": 3}
    )


def test_decode_step_counts_in_the_scheduler(stock: Arm, model: Path) -> None:
    doc = census(stock, model, "decode-step", {"SGLANG_OPT_NOT_A_SWITCH": "1"})
    assert doc["steps"] == 3
    # a switch the engine never reads: every metric is "not measured", never a silent "unchanged"
    assert set(doc["metrics"].values()) == {None}
    assert any("SGLANG_OPT_NOT_A_SWITCH set but never read" in n for n in doc["notes"])
    counted = doc["detail"]["uncounted"]
    assert counted["host-syncs"] >= 1 and counted["eager-launches"] > 10
    assert all(site.startswith("sglang/srt/") for site, _ in doc["sites"]["host-syncs"])
    assert doc["detail"]["per_step"][0]["host-syncs"] == doc["detail"]["per_step"][-1]["host-syncs"]


def test_fp8_lm_head_halves_the_heads_gemm_bytes_at_least(model: Path) -> None:
    """0006 (FP8 lm_head): on the branch a GPU takes (the census stands the SM89+ gate in as SM90; torch._scaled_mm on
    torch's CPU kernel), the head's matrix multiply reads the e4m3 copy: its gemm-bytes at least halve (a BF16 head
    2x, the tiny model's fp32 head 4x) and no other GEMM changes. Fails on the stock wheel (the switch is never read:
    every metric None) and on the patch as declared before (bytes-moved, host<->device bytes: 80 -> 80)."""
    patched = arms_for(REPO, "sglang").patched
    off = census(patched, model, "decode-step")
    on = census(patched, model, "decode-step", {"SGLANG_OPT_FP8_LM_HEAD": "1"})
    assert on["metrics"]["gemm-bytes"] is not None, on["notes"]

    def at(doc: dict[str, Any], file: str) -> int:
        return sum(int(n) for site, n in doc["sites"]["gemm-bytes"] if file in site)

    head_off, head_on = at(off, "logits_processor.py"), at(on, "fp8_lm_head.py")
    assert head_off > 0 and head_on > 0, (off["sites"]["gemm-bytes"], on["sites"]["gemm-bytes"])
    assert at(on, "logits_processor.py") == 0  # the stock head GEMM no longer runs
    assert head_off / head_on > 1.9
    body_off = sum(int(n) for _, n in off["sites"]["gemm-bytes"]) - head_off
    body_on = sum(int(n) for _, n in on["sites"]["gemm-bytes"]) - head_on
    assert body_off == body_on
    assert on["metrics"]["gemm-bytes"] < off["metrics"]["gemm-bytes"]


def test_sampled_decode_step_counts_the_filtered_draw(model: Path) -> None:
    """decode-step-sampled takes the pytorch backend's filtered path (top-k 20, top-p 0.8). 0004 (the Gumbel draw
    after the filters): its switch is read, and the step's eager launches drop by multinomial's validity checks
    (13 ops of multinomial's kernel -> exponential_, clamp_min_, div, argmax); host syncs are unchanged (the checks
    are device-side asserts). Fails on the stock wheel (the switch is never read: every metric None)."""
    patched = arms_for(REPO, "sglang").patched
    off = census(patched, model, "decode-step-sampled")
    on = census(patched, model, "decode-step-sampled", {"SGLANG_OPT_GUMBEL_TOPK_TOPP_SAMPLE": "1"})
    assert off["detail"]["kinds"].get("expanded:aten.multinomial") == 3  # one filtered draw per step
    assert on["metrics"]["eager-launches"] is not None, on["notes"]
    assert off["metrics"]["eager-launches"] - on["metrics"]["eager-launches"] == 9.0
    assert on["metrics"]["host-syncs"] == off["metrics"]["host-syncs"]
    assert "expanded:aten.multinomial" not in on["detail"]["kinds"]
    assert on["detail"]["kinds"]["eager-launches:aten.exponential_"] == 3
