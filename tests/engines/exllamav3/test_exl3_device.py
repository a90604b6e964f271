"""ExLlamaV3's part of the device run (scripts/device/exllamav3_check.py, plan.py): what its estimates rest on, where
its builds and probes fit the device session, and its dry run on CPU (the same harness with the extension stand-in
and the probes' reference kernels; no GPU has run it)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from overlay.check.envs import Arms

REPO = Path(__file__).resolve().parents[3]
DEVICE = REPO / "scripts" / "device"
EXT = "exllamav3/exllamav3_ext/"


def _load(name: str, path: Path) -> ModuleType:
    for extra in (str(DEVICE), str(REPO / "scripts"), str(REPO / "src" / "overlay" / "engines" / "workers")):
        if extra not in sys.path:
            sys.path.insert(0, extra)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


plan = _load("plan", DEVICE / "plan.py")


def _units(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as whl:
        return sorted(
            n[len(EXT) :]
            for n in whl.namelist()
            if n.startswith(EXT) and n.endswith((".c", ".cpp", ".cu")) and not n.startswith(EXT + "rocm/")
        )


def test_build_estimates_cover_the_units_that_build(arms: Arms, tmp_path: Path) -> None:
    """The stock estimate counts every translation unit of a CUDA build once (its families' sizes add up to the
    wheel's units); the patched estimate is measured on exactly the units the series makes an incremental build
    recompile (the two wheels' difference and the include graph). A series that changes other units fails here: the
    plan's calibration is stale."""
    stock_units = _units(arms.stock.wheel)
    assert sum(n for n, _, _ in plan.EXL3_UNIT_CPU_S) == len(stock_units) == 194
    assert {u for _, _, samples in plan.EXL3_UNIT_CPU_S for u in samples} <= set(stock_units)
    bx = _load("build_exllamav3_ext", REPO / "scripts" / "build_exllamav3_ext.py")
    trees = {}
    for name, wheel in (("stock", arms.stock.wheel), ("patched", arms.patched.wheel)):
        with zipfile.ZipFile(wheel) as whl:
            whl.extractall(tmp_path / name, [n for n in whl.namelist() if n.startswith(EXT)])
        trees[name] = tmp_path / name / EXT
    rebuild = bx.select_units(trees["patched"], trees["stock"], "rebuild", [])
    assert sorted(u for _, u in plan.EXL3_PATCHED_UNIT_CPU_S) == rebuild
    # the incremental build is bound by its longest unit (bindings.cpp), not by the share of 14 jobs
    longest = max(cpu for cpu, _ in plan.EXL3_PATCHED_UNIT_CPU_S)
    assert round(longest + plan.EXL3_LINK_S) == plan.EXL3_PATCHED_BUILD_S
    assert plan.EXL3_STOCK_BUILD_S > plan.EXL3_PATCHED_BUILD_S


def test_the_schedule_says_what_fits_the_session() -> None:
    s = plan.exl3_schedule(plan.DEFAULT_BUDGET_S)
    split = plan.split_budget(plan.DEFAULT_BUDGET_S)
    build = plan.EXL3_STOCK_BUILD_S + plan.EXL3_PATCHED_BUILD_S
    call1, call2 = s["call1"], s["call2"]
    assert call1["build_s"] == min(build, split["exllamav3_build"])
    # the first call gives ExLlamaV3's probes nothing unless its builds finish in it
    if build > split["exllamav3_build"]:
        assert call1["probes_s"] == 0 and call2["build_s"] == build - call1["build_s"]
    # the two calls and a machine start within the 15-minute session, each call within its 10 minutes
    assert call2["seconds"] <= plan.DEFAULT_BUDGET_S
    assert (
        plan.MACHINE_START_S + call1["seconds"] + call2["seconds"] + 2 * plan.CALL_TRANSFER_S
        <= plan.SESSION_S
    )
    assert call2["probes_s"] == max(0, call2["seconds"] - plan.SETUP_S - plan.REPORT_S - call2["build_s"])
    assert s["fits"] == (call1["probes_s"] + call2["probes_s"] >= s["probes_needed_s"])


def test_a_warm_machine_skips_an_arm_built_from_the_same_sources(tmp_path: Path) -> None:
    exl3 = _load("exllamav3_check", DEVICE / "exllamav3_check.py")
    site = tmp_path / "site"
    (site / "exllamav3" / "exllamav3_ext").mkdir(parents=True)
    (site / "exllamav3" / "util").mkdir()
    (site / "exllamav3" / "exllamav3_ext" / "k.cu").write_text("// one unit\n")
    (site / "exllamav3" / "util" / "cuda_flags.py").write_text(
        "def cuda_cflags():\n    return ['-O3']\n\ndef ovl_build_defines():\n"
        "    import os\n    return ['-DX=16'] if os.environ.get('X16') else []\n"
    )
    key = exl3.build_key(site)
    assert exl3.build_key(site) == key
    (site / "exllamav3" / "exllamav3_ext" / "k.cu").write_text("// changed\n")
    assert exl3.build_key(site) != key
    changed = exl3.build_key(site)
    os.environ["X16"] = "1"
    try:  # a build define changes what is built
        assert exl3.build_key(site) != changed
    finally:
        del os.environ["X16"]


@pytest.mark.long  # ~10 min on 2 loaded cores: every probe and the ring checks on CPU
def test_exllamav3_check_dry_run(arms: Arms, tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "device_check.py"), "plan", "exllamav3"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    plan_file.write_text(proc.stdout)
    report = tmp_path / "exllamav3-device.json"
    run = arms.patched.run(
        [
            str(DEVICE / "exllamav3_check.py"),
            "--dry-run",
            "--plan",
            str(plan_file),
            "--stock",
            str(arms.stock.wheel),
            "--patched",
            str(arms.patched.wheel),
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(report),
            "--budget",
            "3000",
        ],
        timeout=3600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc: dict[str, Any] = json.loads(report.read_text())
    assert doc["ok"] and doc["dry_run"]
    assert doc["build"]["skipped"].startswith("dry run") and len(doc["build"]["units_to_rebuild"]) == 17
    assert doc["schedule"] == json.loads(json.dumps(plan.exl3_schedule()))
    ran = [m for m in doc["measurements"] if m["status"] == "ok"]
    assert {m["key"] for m in ran} >= {"spec-round", "swa-ring", "drafter-memory"}
    rings = doc["rings"]
    assert rings["ok"] and set(rings["clean"]) == {name for name, *_ in _ring_cases(True)}
    assert all(rings["clean"].values()) and all(rings["equal"].values()) and len(rings["equal"]) == 2
    # the reference kernels never take the graphed step (it runs the layers' own projections)
    assert set(rings["graphed_steps"].values()) == {0}
    mixed = rings["cases"]["mixed-ring"]
    assert mixed["errors"] == [] and mixed["mismatches"] == [0, 0] and len(set(mixed["kv_state_size"])) == 1
    shared = rings["cases"]["shared-kv-ring"]
    assert shared["mismatches"] == 0 and shared["checked"] > 0 and shared["ring"]


def _ring_cases(dry: bool) -> list[tuple[str, str, str, dict[str, Any]]]:
    exl3 = _load("exllamav3_check", DEVICE / "exllamav3_check.py")
    return list(exl3.ring_cases(dry))


def test_ring_cases_run_the_real_kernels_and_the_graphed_path_on_the_gpu() -> None:
    gpu = _ring_cases(False)
    assert {script for _, _, script, _ in gpu} == {"mixed_ring.py", "shared_kv_ring.py"}
    for _, _, _, payload in gpu:
        assert payload["device"] == "cuda" and payload["kernels"] == "real" and payload["graphed"] is True
    for _, _, _, payload in _ring_cases(True):
        assert payload["kernels"] == "reference" and "graphed" not in payload
    # the mixed case is F1's: a checkpoint sliding layer next to a forced --draft_window layer, ring and linear
    mixed = {name: p for name, _, _, p in gpu if name.startswith("mixed-") and "control" not in name}
    assert {p["ring"] for p in mixed.values() if "ring" in p} == {True} and len(mixed) == 2
    assert all(p["layer_types"] == ["sliding_attention", "full_attention"] for p in mixed.values())
