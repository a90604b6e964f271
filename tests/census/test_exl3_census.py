"""The ExLlamaV3 census task (workers/exllamav3_census.py through ExLlamaV3Adapter.run) in the stock and patched arms.

It runs the wheel's own generator round code on CPU with the labelled stand-ins (the extension, the models' forwards,
the generator object); these tests check that it counts in the engine's code (call sites in exllamav3/...), that a
patch's flag moves what it should, and that a flag whose code the CPU path never reaches is reported as not measured
rather than as "unchanged".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arm, Arms, arms_for
from overlay.engines import get_adapter
from overlay.errors import ExternalCommandError

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.long]  # minutes on 2 cores: scripts/test_long.sh


@pytest.fixture(scope="module")
def arms() -> Arms:
    return arms_for(REPO, "exllamav3")


def census(arm: Arm, scenario: str, env: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    run_arm = dataclasses.replace(arm, env={**arm.env, **(env or {})})
    request = {"task": "census", "model": "", "scenario": scenario, "steps": 3, **extra}
    return get_adapter("exllamav3").run(run_arm, request)


def test_scenarios_are_declared() -> None:
    assert get_adapter("exllamav3").census_scenarios() == ("decode-step", "spec-verify-step", "draft-round")


def test_stock_verify_step_counts_in_the_generator(arms: Arms) -> None:
    doc = census(arms.stock, "spec-verify-step")
    assert doc["scenario"] == "spec-verify-step" and doc["steps"] == 3
    # bsz 2: one device-wide synchronize per job after sampling (the reviewer's 1 + B waits per round, B of them here)
    assert doc["metrics"]["host-syncs"] == 2.0
    assert all(site.startswith("exllamav3/generator/generator.py:") for site, _ in doc["sites"]["host-syncs"])
    assert doc["metrics"]["eager-launches"] > 0
    assert doc["metrics"]["peak-memory"] is None and "peak-memory: not counted" in " ".join(doc["notes"])
    assert doc["standin"]


def test_readback_flag_removes_verify_syncs(arms: Arms) -> None:
    stock = census(arms.stock, "spec-verify-step")
    off = census(arms.patched, "spec-verify-step")
    on = census(arms.patched, "spec-verify-step", {"EXL3_OVL_VERIFY_READBACK": "1"})
    assert off["metrics"]["host-syncs"] == stock["metrics"]["host-syncs"]  # flag off: stock behaviour
    assert on["metrics"]["host-syncs"] < off["metrics"]["host-syncs"]


def test_round_sync_moves_the_wait_out_of_the_draft_round(arms: Arms) -> None:
    flag = {"EXL3_OVL_ROUND_SYNC": "1"}
    draft_off, draft_on = census(arms.patched, "draft-round"), census(arms.patched, "draft-round", flag)
    verify_off, verify_on = census(arms.patched, "spec-verify-step"), census(arms.patched, "spec-verify-step", flag)
    assert draft_on["metrics"]["host-syncs"] < draft_off["metrics"]["host-syncs"]
    # ... into the verify step: per round (draft + verify) the count does not move
    assert (draft_on["metrics"]["host-syncs"] + verify_on["metrics"]["host-syncs"]
            == draft_off["metrics"]["host-syncs"] + verify_off["metrics"]["host-syncs"])


def test_a_flag_the_cpu_path_never_reads_is_not_measured(arms: Arms) -> None:
    doc = census(arms.patched, "draft-round", {"EXL3_OVL_SWA_RING": "1"})
    assert set(doc["metrics"].values()) == {None}
    assert any("EXL3_OVL_SWA_RING set but never read" in n for n in doc["notes"])


def test_cli_options_are_refused(arms: Arms) -> None:
    with pytest.raises(ExternalCommandError, match="model_init/loader switches"):
        census(arms.patched, "draft-round", options={"--draft_window": "512"})
