"""scripts/device_check.sh run --dry-run: the device run's harness on CPU (the engines' device scripts in their CPU
test arms, the CPU census as instrument): the same scenario list, budget plan, JSON shape and report writing as on
the GPU. Marked `long` (minutes): scripts/test_long.sh runs it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.network, pytest.mark.long]
RECORD_KEYS = {
    "patch",
    "metric",
    "direction",
    "scenario",
    "declared",
    "flag",
    "stock",
    "flag_off",
    "patched",
    "before",
    "after",
    "holds",
    "sites",
    "note",
    "time",
}


def test_device_check_dry_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "device_check.sh"), "run", "--dry-run", "--budget", "540"],
        cwd=REPO,
        env={**os.environ, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "budget plan: setup 40 s" in proc.stderr
    report = json.loads((tmp_path / "device-check.json").read_text())
    assert report["version"] == 2 and report["kind"] == "device-check" and report["dry_run"]
    assert report["verdict"] == "pass"
    for engine in ("sglang", "exllamav3"):
        result = report["engines"][engine]
        assert result["exit_code"] == 0, (engine, result["log"])
        recs = result["records"]
        assert recs and all(set(r) >= RECORD_KEYS for r in recs)
        # every declared mechanism is in the report: measured, pending with its reason, or not on one GPU
        assert result["summary"]["declared"] == len(recs)
        assert all(r["holds"] is not None or str(r["note"]).startswith("not measured") for r in recs)
        measured = [r for r in recs if r["holds"] is not None]
        assert measured, f"{engine}: the dry run measured nothing"
        raw = result["report"]
        assert raw["version"] == 2 and raw["dry_run"]
        ran = [m for m in raw["measurements"] if m["status"] == "ok"]
        assert ran and all(m.get("by_scenario") for m in ran)
    ex = report["engines"]["exllamav3"]["report"]
    assert ex["build"]["units_to_rebuild"] and len(ex["build"]["units_to_rebuild"]) < ex["build"]["units"]
    assert "carry limit" in report["engines"]["mlx-lm"]["skipped"]
