"""scripts/device_check.sh run --dry-run: the GPU-arm driver's harness on CPU (the engines' device scripts in their CPU
test arms). Marked `long` (about 3 minutes): scripts/test_long.sh runs it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.network, pytest.mark.long]


def test_device_check_dry_run(tmp_path: Path) -> None:
    proc = subprocess.run([str(REPO / "scripts" / "device_check.sh"), "run", "--dry-run", "--budget", "1200"],
                          cwd=REPO, env={**os.environ, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "device-check.json").read_text())
    assert report["version"] == 1 and report["dry_run"] and report["verdict"] == "pass"
    assert report["engines"]["exllamav3"]["report"]["ring"]["ok"]
    assert report["engines"]["sglang"]["report"]["version"] == 1
    assert "carry limit" in report["engines"]["mlx-lm"]["skipped"]
