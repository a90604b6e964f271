"""scripts/device/sglang_check.py --dry-run: the device check's harness, imports and JSON, on the CPU.

The GPU numbers come from running the script on a GPU machine (docs/engines/sglang.md, "Device check"); this
only proves that every benchmark finds its functions in both wheels, compares the same inputs, and writes the
documented report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sglang_support import REPO

from overlay.check.envs import Arms

pytestmark = pytest.mark.slow


def test_device_check_dry_run(arms: Arms, tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    proc = arms.patched.run(
        [
            str(REPO / "scripts" / "device" / "sglang_check.py"),
            "--stock",
            str(arms.stock.site_packages),
            "--patched",
            str(arms.patched.site_packages),
            "--dry-run",
            "--iters",
            "2",
            "--out",
            str(out),
        ],
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["version"] == 1 and report["machine"]["dry_run"] is True
    by_patch = {r["patch"]: r for r in report["results"]}
    assert {r["status"] for r in report["results"]} <= {"ok", "skipped"}
    # the series as it is (12 patches; the issue-14 drops are in patches/sglang/DROPPED and have no benchmark)
    assert set(by_patch) == {"0003", "0004", "0005", "0007", "0008", "0009", "0012"}, sorted(by_patch)
    for patch in ("0003", "0005", "0007", "0008", "0012"):
        assert by_patch[patch]["status"] == "ok", by_patch[patch]
    for patch in ("0003", "0012"):
        assert by_patch[patch]["equal"] is True, by_patch[patch]
    for patch in ("0004", "0009"):
        assert by_patch[patch]["status"] == "skipped"
