"""`overlay check sglang` on the CPU engine path (~15 minutes on 2 cores: marked `long`, run by scripts/test_long.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import Cli

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.network, pytest.mark.long]


def test_check_sglang_cpu_engine(cli: Cli) -> None:
    r = cli(
        "--root",
        str(REPO),
        "check",
        "sglang",
        "--reps",
        "1",
        "--positions",
        "512",
        "--allow-few-positions",
        "--max-tokens",
        "8",
    )
    assert r.code == 0, r.err + r.out
    report = json.loads((REPO / "build" / "reports" / "sglang-check.json").read_text())
    assert report["mode"] == "engine" and report["greedy"]["identical"]
    spec = report["speculative"]
    for label in ("self", "never", "real"):
        assert spec[label]["patched_identical_to_serial"]
        assert spec[label]["patched"]["acceptance_rate"] == spec[label]["stock"]["acceptance_rate"]
    assert spec["never"]["patched"]["acceptance_rate"] < 0.05 < spec["self"]["patched"]["acceptance_rate"]
    assert report["surface"]["compatible"]
