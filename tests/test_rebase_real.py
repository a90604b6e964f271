"""Rebase and review on real upstream history: a small series written against mlx-lm 0.31.2 (tests/data/mlx-lm-0.31.2)
moved to 0.32.2, both wheels from the package index.

The five test patches were written so each lands in a known class on the real 0.31.2 -> 0.32.2 change:
0001 make_prompt_cache (unchanged, same lines: clean), 0002 trim_prompt_cache (unchanged, 27 lines down: offset),
0003 the top_k error message (upstream df489877 / #1377 made the same fix: upstreamed), 0004 make_sampler's min_p test
(upstream rewrote the top_p test two lines above: merged by the 3-way merge), 0005 apply_top_p (rewritten upstream:
conflict, resolved here the way a person would, then --continue).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from overlay.core.manifest import load_engine
from overlay.core.series import load_series
from support import Cli

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "mlx-lm-0.31.2"
pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def old_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mlx031")
    (root / "overlays").mkdir()
    shutil.copy(DATA / "mlx-lm.toml", root / "overlays" / "mlx-lm.toml")
    series = root / "patches" / "mlx-lm"
    series.mkdir(parents=True)
    for p in DATA.iterdir():
        if p.name == "series" or p.name.endswith(".patch"):
            shutil.copy(p, series / p.name)
    (root / "tests").mkdir()
    (root / "tests" / "test_marker.py").write_text("def test_marker():\n    pass\n")
    (REPO / "build" / "cache").mkdir(parents=True, exist_ok=True)
    (root / "build").mkdir()
    (root / "build" / "cache").symlink_to(REPO / "build" / "cache")
    return root


def test_real_series_rebases_0_31_2_to_0_32_2(old_root: Path, cli: Cli) -> None:
    root = ["--root", str(old_root)]
    assert cli(*root, "lint", "mlx-lm").code == 0  # the test series applies exactly at 0.31.2
    r = cli(*root, "rebase", "mlx-lm", "--to", "0.32.2")
    assert r.code == 3, r.err
    report = old_root / "build" / "reports" / "mlx-lm-rebase.json"
    got = [(p["name"][:4], p["class"]) for p in json.loads(report.read_text())["patches"]]
    assert got == [
        ("0001", "clean"),
        ("0002", "offset"),
        ("0003", "upstreamed"),
        ("0004", "merged"),
        ("0005", "conflict"),
    ]
    offset = json.loads(report.read_text())["patches"][1]["offsets"]
    assert offset == [{"path": "mlx_lm/models/cache.py", "hunk": 1, "from": 107, "to": 134, "offset": 27}]
    # resolve the apply_top_p conflict as a person would: keep upstream's new body, re-add our early return
    repo = old_root / "build" / "rebase" / "mlx-lm" / "repo"
    target = repo / "mlx_lm" / "sample_utils.py"
    text, n = re.subn(
        r"<<<<<<< [^\n]*\n(.*?)\|\|\|\|\|\|\| [^\n]*\n.*?>>>>>>> [^\n]*\n",
        lambda m: "    if top_p >= 1.0:\n        return logprobs  # nothing to filter\n" + m.group(1),
        target.read_text(),
        flags=re.DOTALL,
    )
    assert n == 1
    target.write_text(text)
    r = cli(*root, "rebase", "mlx-lm", "--continue")
    assert r.code == 3 and "stopped for review" in r.err, (
        r.err
    )  # 0004 was merged: looked at before publishing
    assert "REVIEW 1 patch resolved by a 3-way merge, not applied as written: 0004-" in r.out
    assert load_engine(old_root, "mlx-lm").upstream.version == "0.31.2"
    r = cli(*root, "rebase", "mlx-lm", "--publish")
    assert r.code == 0, r.err
    # published: the pin is the real 0.32.2 wheel (the same file the repository pins), the series moved
    pinned = load_engine(REPO, "mlx-lm").upstream.primary
    m = load_engine(old_root, "mlx-lm")
    assert m.upstream.version == "0.32.2" and m.upstream.commit is None
    assert (m.upstream.primary.filename, m.upstream.primary.sha256) == (pinned.filename, pinned.sha256)
    series = load_series(old_root / "patches" / "mlx-lm")
    assert series.base_version == "0.32.2"
    assert [p.name[:4] + ":" + p.subject.split(":")[0] for p in series.patches] == [
        "0001:cache",
        "0002:cache",
        "0003:sample_utils",
        "0004:sample_utils",
    ]
    ledger = (old_root / "patches" / "mlx-lm" / "DROPPED").read_text()
    assert "patch: 0003-sample_utils-the-top_k-error-names-the-open-interval.patch" in ledger
    assert "upstream-status: Backport https://github.com/ml-explore/mlx-lm/pull/1377" in ledger
    assert "if top_p >= 1.0:" in series.patches[3].raw.decode()
    assert cli(*root, "lint", "mlx-lm").code == 0  # every rebased patch applies exactly at 0.32.2


def test_real_review_names_the_changed_symbols(old_root: Path, cli: Cli) -> None:
    if load_engine(old_root, "mlx-lm").upstream.version != "0.32.2":
        pytest.skip("needs the rebase of the previous test")
    html = old_root / "build" / "reports" / "mlx-lm-review.html"
    r = cli(
        "--root",
        str(old_root),
        "review",
        "mlx-lm",
        "--from",
        "0.31.2",
        "--to",
        "0.32.2",
        "--html",
        str(html),
        "--json",
    )
    assert r.code == 0, r.err
    data = json.loads(r.out)
    status = {s["symbol"]: (s["status"], s["flagged"]) for s in data["symbols"]}
    assert status == {
        "make_prompt_cache": ("unchanged", False),
        "trim_prompt_cache": ("unchanged", False),
        "apply_top_k": ("changed", False),
        "make_sampler": ("changed", False),
        "apply_top_p": ("rewritten", True),
    }
    assert [d["patch"][:4] + ":" + d["evidence"] for d in data["duplicates"]] == ["0003:reverse-applies"]
    assert [(e["old"][:4], e["kind"], (e["new"] or "-")[:4]) for e in data["range_diff"]] == [
        ("0001", "identical", "0001"),
        ("0002", "identical", "0002"),
        ("0003", "dropped", "-"),
        ("0004", "context-only", "0003"),
        ("0005", "context-only", "0004"),
    ]
    page = html.read_text()
    assert "apply_top_p" in page and "0005-sample_utils-apply_top_p-returns-at-once-when-top_p-.patch" in page


@pytest.mark.slow
def test_real_sglang_dry_run_tells_own_from_inherited_conflicts(tmp_path: Path, cli: Cli) -> None:
    """sglang's series at 0.5.23 dry-run onto 0.5.22: each conflict is the patch's own or inherited (naming where
    from; the synthetic own/inherited cases are tests/test_rebase_dry_run.py). The series' flags are declared in one
    first patch (0001), so srt/environ.py is no merge hotspot any more (before: 16 of 18 patches touched the same
    lines there, 16 conflicts of which 11 inherited; the 12-patch series has 3, all its own)."""
    root = tmp_path / "repo"
    (root / "build").mkdir(parents=True)
    shutil.copytree(REPO / "overlays", root / "overlays")
    shutil.copytree(REPO / "patches", root / "patches")
    shutil.copytree(
        REPO / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__", "tinymodels")
    )
    (root / "build" / "cache").symlink_to(REPO / "build" / "cache")
    if load_engine(root, "sglang").upstream.version != "0.5.23":
        pytest.skip("sglang is no longer pinned at 0.5.23")
    r = cli("--root", str(root), "rebase", "sglang", "--to", "0.5.22", "--dry-run", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    conflicts = [p for p in data["patches"] if p["class"] == "conflict"]
    own = [p for p in conflicts if p["conflict_kind"] == "own"]
    inherited = [p for p in conflicts if p["conflict_kind"] == "inherited"]
    assert len(own) + len(inherited) == len(conflicts) and own
    assert data["conflicts"] == {"own": len(own), "inherited": len(inherited)}
    assert all(p["inherited_from"] for p in inherited)
    assert len(conflicts) < 16 and len(inherited) < len(
        own
    )  # the environ.py hotspot no longer conflicts every patch
    r = cli("--root", str(root), "lint", "sglang")
    assert r.code == 0, r.err
    assert not any("merge hotspot" in line and "srt/environ.py" in line for line in r.err.splitlines()), r.err
