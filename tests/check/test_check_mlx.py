"""`overlay check mlx-lm` for real: stock and patched wheels in their venvs, bundled tiny models, reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support import Cli

REPO = Path(__file__).resolve().parents[2]
QUICK = [
    "--target-kind",
    "llama-random",
    "--draft-kind",
    "llama-draft-random",
    "--reps",
    "1",
    "--positions",
    "2048",
    "--allow-few-positions",
    "--max-tokens",
    "12",
]
pytestmark = [pytest.mark.network, pytest.mark.slow]

GIT_ENV = {
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def chromium_dom(html: Path, screenshot: Path) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed (scripts/test.sh installs Debian's chromium)")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        f"--user-data-dir={html.parent / '.chromium'}",
    ]
    subprocess.run(
        [exe, *flags, f"--screenshot={screenshot}", "--window-size=1300,2400", html.as_uri()],
        capture_output=True,
        timeout=120,
    )
    dom = subprocess.run(
        [exe, *flags, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120
    )
    return dom.stdout


@pytest.mark.long  # ~7 minutes on 2 cores; README's first command (scripts/main.sh) runs the same check
@pytest.mark.browser
def test_check_mlx_lm_passes_on_the_shipped_series(cli: Cli) -> None:
    r = cli("--root", str(REPO), "check", "mlx-lm", *QUICK)
    assert r.code == 0, r.err + r.out
    report = json.loads((REPO / "build" / "reports" / "mlx-lm-check.json").read_text())
    for key in (
        "engine",
        "model",
        "arms",
        "greedy",
        "logits",
        "speculative",
        "speed",
        "noise_floor",
        "verdict",
    ):
        assert key in report
    assert report["verdict"] == "pass" and report["greedy"]["identical"]
    assert report["logits"]["positions"] >= 2048
    spec = report["speculative"]
    assert spec["self"]["patched"]["acceptance_rate"] >= 0.98
    assert spec["never"]["patched"]["acceptance_rate"] == 0.0 and spec["never"]["patched_identical_to_serial"]
    for arm in ("stock", "patched"):
        assert report["speed"][arm]["decode_tok_s"]["median"] > 0
    assert set(report["speed"]["ratio"]) >= {"decode", "prefill", "cold_start"}
    assert report["noise_floor"]["logits"]["bit_identical"]
    assert "greedy" in r.out and "gate pass" in r.out
    dom = chromium_dom(
        REPO / "build" / "reports" / "mlx-lm-check.html", REPO / "build" / "reports" / "mlx-lm-check.png"
    )
    assert "PASS" in dom and "Teacher-forced logits" in dom and "Speculative decoding" in dom
    for p in report["series"]["patches"]:
        assert p["name"] in dom
    assert (REPO / "build" / "reports" / "mlx-lm-check.png").stat().st_size > 10_000


@pytest.mark.long  # a second full check (about a minute on 2 cores): scripts/test_long.sh
def test_per_patch_attributes_a_numerics_change_and_exits_4(tmp_path: Path, cli: Cli) -> None:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "overlays", root / "overlays")
    # a two-patch series: the shipped 0001 (exact) and a deliberately inexact change claimed exact
    (root / "patches" / "mlx-lm").mkdir(parents=True)
    shipped = (REPO / "patches" / "mlx-lm" / "series").read_text().splitlines()
    first = next(line for line in shipped[1:] if line.startswith("0001-"))
    shutil.copy(REPO / "patches" / "mlx-lm" / first, root / "patches" / "mlx-lm" / first)
    (root / "patches" / "mlx-lm" / "series").write_text(f"{shipped[0]}\n{first}\n")
    shutil.copytree(REPO / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "build").mkdir()
    for d in ("cache", "venvs", "models"):
        (REPO / "build" / d).mkdir(parents=True, exist_ok=True)
        (root / "build" / d).symlink_to(REPO / "build" / d)
    wt = Path(cli("--root", str(root), "-q", "checkout", "mlx-lm").out.strip())
    llama = wt / "mlx_lm" / "models" / "llama.py"
    llama.write_text(
        llama.read_text().replace(
            "            out = self.lm_head(out)\n", "            out = self.lm_head(out) * 1.0001\n", 1
        )
    )
    msg = (
        "llama: scale logits (a deliberately inexact change)\n\nTest fixture: claims exact but is not.\n\n"
        "Overlay-Theme: other\nOverlay-Numerics: exact\nOverlay-Check: tests/check/test_check_mlx.py::"
        "test_per_patch_attributes_a_numerics_change_and_exits_4\nUpstream-Status: Inappropriate test fixture\nOverlay-Flag: default\n"
    )
    subprocess.run(["git", "commit", "-qam", msg], cwd=wt, env={**os.environ, **GIT_ENV}, check=True)
    assert cli("--root", str(root), "-q", "refresh", "mlx-lm").code == 0
    n = len((root / "patches" / "mlx-lm" / "series").read_text().splitlines()) - 1
    r = cli("--root", str(root), "check", "mlx-lm", "--per-patch", *QUICK)
    assert r.code == 4, r.err
    report = json.loads((root / "build" / "reports" / "mlx-lm-check.json").read_text())
    assert report["verdict"] == "fail"
    failing = {g["subject"] for g in report["gates"] if not g["passed"]}
    last = report["series"]["patches"][-1]["name"]
    assert failing == {last, "series"}  # the series is exact too (0001 + 0002), and it differs
    rows = report["per_patch"]
    assert len(rows) == n
    assert all(row["logits_vs_previous"]["bit_identical"] for row in rows[:-1])
    assert not rows[-1]["logits_vs_previous"]["bit_identical"]
    assert "ERROR" in r.err and "gate(s) failed" in r.err
