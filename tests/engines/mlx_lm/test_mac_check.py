"""scripts/mac_check.sh (the one-command Metal check for a Mac) runs on Linux: its plan, its refusal, its harness.

- ``--dry-run`` prints the plan: two venvs (stock from PyPI at the pin, patched from ``overlay apply``), and the
  cases serial / draft model / MTP (patched only) for k = 1..3 at T = 0 and 0.7.
- Without a Mac and without interpreters it refuses (exit 2) instead of building CPU venvs; so it does, before
  anything is installed, with a Python older than 3.11 (the shell script checks it) or without the overlay venv that
  builds the patched wheel, each message naming the fix.
- A split MTP drafter folder (``--mtp-drafter``, patch 0027) is planned as the head of ``--model``; naming both
  ``--mtp-model`` and ``--mtp-drafter`` is refused.
- With ``--stock-python`` / ``--patched-python`` (the stock and patched arm venvs, ``mlx[cpu]``) the real harness
  runs on the tiny qwen3 of the speculative tests (drafting for itself as the draft model) and the qwen3_next MTP
  checkpoint (drafting with its MTP head), and writes the JSON report: tok/s, acceptance, tokens per verify, and byte identity with stock serial decoding at
  T = 0, which must hold for every speculative case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_spec_mtp import families, text_model  # noqa: F401 - fixtures

from overlay.check.envs import Arms

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "mac_check.sh"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **(env or {})},
    )


def test_dry_run_plan() -> None:
    proc = _run("--model", "mlx-community/X-4bit", "--draft-model", "mlx-community/Y-4bit", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["pin"] == "0.32.2"
    assert any("mlx-lm==0.32.2" in cmd for cmd in plan["install"]["stock"][-1])
    assert plan["install"]["patched"][0][1:3] == ["apply", "mlx-lm"]
    ids = {arm: {c["id"] for c in cases} for arm, cases in plan["cases"].items()}
    for temp in ("0.0", "0.7"):
        for arm in ("stock", "patched"):
            assert f"serial/T{temp}" in ids[arm]
            assert {f"draft/k{k}/T{temp}" for k in (1, 2, 3)} <= ids[arm]
        assert {f"mtp/k{k}/T{temp}" for k in (1, 2, 3)} <= ids["patched"]
    assert not any(i.startswith("mtp/") for i in ids["stock"])


def test_split_mtp_drafter_plan() -> None:
    proc = _run("--model", "mlx-community/X-4bit", "--mtp-drafter", "mlx-community/X-MTP-bf16", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["mtp"] == {"drafter": "mlx-community/X-MTP-bf16"}
    ids = {c["id"] for c in plan["cases"]["patched"]}
    assert {f"mtp/k{k}/T0.0" for k in (1, 2, 3)} <= ids
    assert not any(i.startswith("serial-mtp/") for i in ids), (
        "the drafter's reference is --model's serial decoding"
    )
    both = _run("--model", "m", "--mtp-model", "a", "--mtp-drafter", "b")
    assert both.returncode == 2 and "--mtp-model and --mtp-drafter" in both.stderr


def test_refuses_an_old_python(tmp_path: Path) -> None:
    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\necho 3.9\nexit 1\n")
    old.chmod(0o755)
    proc = _run("--model", "m", "--dry-run", env={"PYTHON": str(old)})
    assert proc.returncode == 2
    assert "needs Python >= 3.11" in proc.stderr and "3.9" in proc.stderr and "PYTHON=" in proc.stderr


def test_refuses_without_the_overlay_venv(tmp_path: Path) -> None:
    missing = tmp_path / "no-venv" / "overlay"
    plan = json.loads(_run("--model", "m", "--overlay", str(missing), "--dry-run").stdout)
    assert plan["problems"] and str(missing) in plan["problems"][0]
    proc = _run("--model", "m", "--overlay", str(missing))
    assert proc.returncode == 2 and "overlay venv" in proc.stderr and "pip install -e ." in proc.stderr
    assert not (tmp_path / "no-venv").exists()
    # An existing patched interpreter needs no overlay venv.
    ok = json.loads(
        _run("--model", "m", "--overlay", str(missing), "--patched-python", "/x", "--dry-run").stdout
    )
    assert ok["problems"] == []


def test_refuses_to_build_venvs_off_mac() -> None:
    if sys.platform == "darwin":
        return
    proc = _run("--model", "m", "--overlay", sys.executable)  # any existing file: the overlay venv is there
    assert proc.returncode == 2 and "Apple-silicon Mac" in proc.stderr


def test_harness_runs_with_existing_interpreters(
    arms: Arms,
    models: dict[str, str],
    text_model: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = tmp_path / "mac-check.json"
    proc = _run(
        "--model",
        models["qwen3"],
        "--draft-model",
        models["qwen3"],
        "--mtp-model",
        text_model,
        "--stock-python",
        str(arms.stock.python),
        "--patched-python",
        str(arms.patched.python),
        "--tokens",
        "12",
        "--ks",
        "1,2",
        "--temps",
        "0,0.7",
        "--seeds",
        "0,1",
        "--prompt",
        "<5> <9> <13> <17>",
        "--prompt",
        "<7> <8>",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    stock, patched = doc["arms"]["stock"]["cases"], doc["arms"]["patched"]["cases"]
    assert not any(i.startswith("mtp/") for i in stock)
    for cases in (stock, patched):
        for cid, row in cases.items():
            assert "error" not in row, (cid, row.get("error"))
            assert row["tok_s"] and row["tok_s"] > 0
            if cid.endswith("T0.0"):
                assert row["identical_to_stock_serial"], cid
    # The model drafting for itself accepts nearly everything at T = 0, and (rejection sampling) still most at 0.7.
    assert patched["draft/k2/T0.0"]["acceptance"] > 0.9
    assert patched["draft/k2/T0.7"]["acceptance"] > 0.8
    assert "mtp/k2/T0.7" in patched and "vs_stock_serial" in patched["mtp/k2/T0.7"]
