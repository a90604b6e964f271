"""The mechanism census gate of `overlay check` (src/overlay/check/census.py).

(a) Pure units: the holds logic, the flag switch, caching, record building and gates, on a fake census task.
(b) For real: a three-patch series over the pinned mlx-lm wheel, built in tmp_path with `overlay checkout` / `refresh`
    (arms and models reuse build/ of this repository), where one patch really lowers ops-per-token in decode-token,
    one adds an op while declaring a decrease, and one adds an mx.eval per token while declaring fewer evals:
    `overlay check mlx-lm --mechanism` exits 4 and names exactly the two wrong patches.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from overlay.check import census, census_report
from overlay.check.census import Census, Variant, switch_for
from overlay.check.census_rules import aggregate, decide
from overlay.check.envs import Arm
from overlay.core.mechanism import parse_flag
from overlay.core.series import parse_patch_bytes
from overlay.schemas.documents import WorkerRequest

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ (a) pure units


@pytest.mark.parametrize(
    ("direction", "before", "after", "holds"),
    [
        ("decreases", 10.0, 9.0, True),
        ("decreases", 10.0, 10.0, False),
        ("decreases", 10.0, 11.0, False),
        ("increases", 1.0, 2.0, True),
        ("increases", 2.0, 2.0, False),
        ("unchanged", 3.0, 3.0 + 1e-9, True),
        ("unchanged", 3.0, 3.25, False),
        ("decreases", None, 2.0, None),
        ("decreases", 2.0, None, None),
    ],
)
def test_decide_counts(direction: str, before: Any, after: Any, holds: bool | None) -> None:
    assert decide("ops-per-token", direction, before, after)[0] is holds


@pytest.mark.parametrize(
    ("metric", "direction", "before", "after", "holds"),
    [
        ("peak-memory", "unchanged", 930_396.0, 931_808.0, True),  # within the allocator's noise floor
        (
            "peak-memory",
            "unchanged",
            671_560.0,
            679_060.0,
            True,
        ),  # the tiny DSA model's run-to-run spread (1.1%)
        (
            "peak-memory",
            "unchanged",
            930_396.0,
            996_000.0,
            False,
        ),  # an extra buffer kept per step (7%) is a change
        ("peak-memory", "decreases", 930_396.0, 929_884.0, False),  # noise is no decrease
        ("peak-memory", "decreases", 2_427_480.0, 1_983_680.0, True),  # 0019's ring: 18% lower
        ("peak-memory", "decreases", 930_396.0, 996_000.0, False),  # an extra buffer kept per step
        ("ops-per-token", "unchanged", 930_396.0, 930_397.0, False),  # counts stay exact
    ],
)
def test_decide_memory_within_the_allocator_noise(
    metric: str, direction: str, before: float, after: float, holds: bool
) -> None:
    assert decide(metric, direction, before, after)[0] is holds


@pytest.mark.parametrize(
    ("before", "after", "holds"),
    [
        (False, True, True),
        (None, True, True),
        (True, True, False),
        (False, False, False),
        (False, None, None),
    ],
)
def test_decide_becomes_true(before: Any, after: Any, holds: bool | None) -> None:
    assert decide("capturable", "becomes-true", before, after)[0] is holds


def test_aggregate_over_variants() -> None:
    def row(name: str, before: float, after: float, holds: bool | None) -> dict[str, Any]:
        return {"variant": name, "before": before, "after": after, "holds": holds}

    # a patch acting on one model family only holds; one that moves the other way anywhere does not
    assert aggregate("decreases", [row("dense", 5, 5, False), row("hybrid", 9, 7, True)])[0] is True
    assert aggregate("decreases", [row("dense", 5, 6, False), row("hybrid", 9, 7, True)])[0] is False
    assert aggregate("decreases", [row("dense", 5, 5, False), row("hybrid", 9, 9, False)])[0] is False
    assert aggregate("unchanged", [row("dense", 5, 5, True), row("hybrid", 9, 8, False)])[0] is False
    assert aggregate("decreases", [row("dense", 5, 5, None)])[0] is None


def test_switch_from_flags() -> None:
    sw = switch_for([parse_flag("MLX_LM_FUSED_PROJ=1"), parse_flag("--draft-max-kv-size=64")])
    assert sw.env == (("MLX_LM_FUSED_PROJ", "1"),) and sw.options == (("--draft-max-kv-size", "64"),)
    assert not sw.default and sw.text == "MLX_LM_FUSED_PROJ=1 --draft-max-kv-size=64"
    assert switch_for([parse_flag("default")]).default and switch_for([]).text == "default"


def _patch(name: str, *trailers: str) -> Any:
    raw = (
        f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: T <t@example.com>\n"
        f"Date: Fri, 2 Jan 2026 03:04:05 +0000\nSubject: [PATCH] {name}\n\nBody.\n\nOverlay-Theme: other\n"
        "Overlay-Numerics: exact\nOverlay-Check: tests/x.py\nUpstream-Status: Pending\n"
        + "".join(f"{t}\n" for t in trailers)
        + "---\n x | 1 +\n\ndiff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1,2 @@\n a\n+b\n"
    )
    return parse_patch_bytes(raw.encode(), name=f"{name}.patch")


def _arm(tmp_path: Path, name: str) -> Arm:
    return Arm(name=name, engine="fake", venv=tmp_path / name, wheel=tmp_path / f"{name}.whl", version="1")


class FakeEngine:
    """Census results by arm and environment: ops per step as a table, recording every request."""

    def __init__(self, table: dict[tuple[str, str], float]) -> None:
        self.table = table
        self.calls: list[tuple[str, dict[str, Any], dict[str, str]]] = []

    def __call__(self, arm: Arm, request: WorkerRequest) -> dict[str, Any]:
        assert request["task"] == "census"
        self.calls.append((arm.name, dict(request), dict(arm.env)))
        key = (arm.name, ",".join(f"{k}={v}" for k, v in sorted(arm.env.items())))
        if key not in self.table:
            from overlay.errors import ExternalCommandError

            raise ExternalCommandError(f"worker crashed\nno entry {key}")
        ops = self.table[key]
        return {
            "scenario": request["scenario"],
            "steps": request["steps"],
            "metrics": {"ops-per-token": ops, "evals-per-token": 2.0, "capturable": None},
            "sites": {"ops-per-token": [["gen.py:10", ops]]},
            "notes": [],
            "standin": None,
        }


def test_records_judge_the_patch_s_own_effect(tmp_path: Path) -> None:
    stock, patched = _arm(tmp_path, "stock"), _arm(tmp_path, "patched")
    upto1 = _arm(tmp_path, "upto-1")
    series = [
        _patch(
            "0001-always-on",
            "Overlay-Flag: default",
            "Overlay-Mechanism: ops-per-token decreases in decode-token",
        ),
        _patch(
            "0002-opt-in",
            "Overlay-Flag: FAKE_FUSE=1",
            "Overlay-Mechanism: ops-per-token decreases in decode-token",
            "Overlay-Mechanism: evals-per-token decreases in decode-token",
            "Overlay-Mechanism: ops-per-token decreases in spec-verify-step",
            "Overlay-Mechanism: host-syncs decreases in decode-token",
        ),
    ]
    # 0001 lowers 100 -> 90; 0002's flag lowers 90 -> 80 in the full series; the flag off equals the prefix
    fake = FakeEngine(
        {("stock", ""): 100.0, ("upto-1", ""): 90.0, ("patched", ""): 90.0, ("patched", "FAKE_FUSE=1"): 80.0}
    )
    prefixes = {0: stock, 1: upto1, 2: patched}
    c = Census(fake, variants=[Variant("tiny", "/m")], steps=3)
    recs = census.census_records(
        patches=series,
        census=c,
        stock=stock,
        patched=patched,
        scenarios=("decode-token", "prefill-chunk"),
        prefix_arm=prefixes.__getitem__,
    )
    by = {(r["patch"], r["declared"]): r for r in recs}
    r1 = by[("0001-always-on.patch", "ops-per-token decreases in decode-token")]
    assert (r1["holds"], r1["stock"], r1["patched"], r1["before"], r1["after"]) == (
        True,
        100.0,
        90.0,
        100.0,
        90.0,
    )
    assert "upto-1" in r1["baseline"] and r1["flag"] == "default"
    r2 = by[("0002-opt-in.patch", "ops-per-token decreases in decode-token")]
    assert (r2["holds"], r2["flag_off"], r2["patched"], r2["flag"]) == (True, 90.0, 80.0, "FAKE_FUSE=1")
    assert r2["gated"] is False  # the flag off is not stock: 0001 acts here too
    evals = by[("0002-opt-in.patch", "evals-per-token decreases in decode-token")]
    assert evals["holds"] is False and "does not decrease" in evals["note"]
    missing = by[("0002-opt-in.patch", "ops-per-token decreases in spec-verify-step")]
    assert missing["holds"] is None and "no scenario 'spec-verify-step'" in missing["note"]
    uncounted = by[("0002-opt-in.patch", "host-syncs decreases in decode-token")]
    assert uncounted["holds"] is None and "not counted" in uncounted["note"]
    # each configuration ran once: stock, upto-1, patched (flag off), patched (flag on)
    assert c.runs == 4 and len(fake.calls) == 4
    assert ("patched", "FAKE_FUSE=1") in {
        (n, ",".join(f"{k}={v}" for k, v in e.items())) for n, _r, e in fake.calls
    }
    assert all(
        req["task"] == "census" and req["steps"] == 3 and req["model"] == "/m" for _n, req, _e in fake.calls
    )
    gates = census_report.gates(recs)
    assert [(g["subject"], g["gate"], g["passed"]) for g in gates] == [
        ("0002-opt-in.patch", "evals-per-token decreases in decode-token", False)
    ]
    assert census_report.gates(recs, enforce=False) == []
    assert census_report.summary(recs) == {"declared": 5, "hold": 2, "do_not_hold": 1, "not_measured": 2}
    assert census_report.top_sites_diff(r1) == [("gen.py:10", 100.0, 90.0)]
    assert census_report.line(evals).startswith(
        "mechanism DOES NOT HOLD 0002-opt-in.patch: evals-per-token decreases"
    )


def test_report_html_and_terminal_show_the_census(tmp_path: Path) -> None:
    from overlay.check.html import render
    from overlay.cli.cmd_check import table_lines

    stock, patched = _arm(tmp_path, "stock"), _arm(tmp_path, "patched")
    series = [
        _patch("0001-x", "Overlay-Flag: FAKE=1", "Overlay-Mechanism: ops-per-token decreases in decode-token")
    ]
    fake = FakeEngine({("stock", ""): 10.0, ("patched", ""): 10.0, ("patched", "FAKE=1"): 12.0})
    recs = census.census_records(
        patches=series,
        census=Census(fake, variants=[Variant("v", "/m")]),
        stock=stock,
        patched=patched,
        scenarios=("decode-token",),
    )
    report = {
        "engine": "fake",
        "verdict": "fail",
        "mode": "mechanism",
        "notes": [],
        "arms": {
            "stock": {"wheel": "s.whl", "version": "1"},
            "patched": {"wheel": "p.whl", "version": "1+o"},
        },
        "series": {"class": "exact", "patches": []},
        "gates": census_report.gates(recs),
        "mechanism": recs,
        "mechanism_summary": {**census_report.summary(recs), "steps": 4, "gated": True},
    }
    page = render(report)
    assert "<h2>Mechanism census</h2>" in page and "DOES NOT HOLD" in page and "0001-x.patch" in page
    assert "gen.py:10" in page  # what moved: the site, 10 -> 12
    lines = table_lines(report)
    assert any(line.startswith("mechanism DOES NOT HOLD 0001-x.patch") for line in lines)
    assert "mechanism: 1 declared, 0 hold, 1 do not hold, 0 not measured" in lines


def test_a_failing_census_task_is_not_measured_never_holding(tmp_path: Path) -> None:
    stock, patched = _arm(tmp_path, "stock"), _arm(tmp_path, "patched")
    series = [
        _patch("0001-x", "Overlay-Flag: FAKE=1", "Overlay-Mechanism: ops-per-token decreases in decode-token")
    ]
    fake = FakeEngine({("stock", ""): 10.0, ("patched", ""): 10.0})  # the flag-on run crashes
    recs = census.census_records(
        patches=series,
        census=Census(fake, variants=[Variant("v", "/m")]),
        stock=stock,
        patched=patched,
        scenarios=("decode-token",),
    )
    assert (
        recs[0]["holds"] is None and "census task failed" in recs[0]["note"] and "no entry" in recs[0]["note"]
    )
    assert census_report.gates(recs) == []


# ------------------------------------------------------------------ (b) the real mlx-lm arms

GIT_ENV = {
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
HEADS = (
    "        queries = queries.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)\n"
    "        keys = keys.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)\n"
    "        values = values.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)\n"
)
ONE_TOKEN = (
    "        if L == 1:  # one token: the head transpose is a reshape (same memory order)\n"
    "            queries = queries.reshape(B, self.n_heads, 1, -1)\n"
    "            keys = keys.reshape(B, self.n_kv_heads, 1, -1)\n"
    "            values = values.reshape(B, self.n_kv_heads, 1, -1)\n"
    "        else:\n" + "".join("    " + line + "\n" for line in HEADS.splitlines())
)
RETURN = "            return sampled, logprobs.squeeze(0)\n"
YIELD = "            yield y.item(), logprobs\n"


def _commit(wt: Path, subject: str, theme: str, mechanism: str) -> None:
    msg = (
        f"{subject}\n\nTest fixture of tests/check/test_census_gate.py.\n\nOverlay-Theme: {theme}\n"
        "Overlay-Numerics: exact\nOverlay-Check: tests/check/test_census_gate.py\n"
        f"Upstream-Status: Inappropriate test fixture\nOverlay-Flag: default\nOverlay-Mechanism: {mechanism}\n"
    )
    subprocess.run(["git", "commit", "-qam", msg], cwd=wt, env={**os.environ, **GIT_ENV}, check=True)


@pytest.mark.long  # ~1 minute on 2 cores: scripts/test_long.sh
@pytest.mark.network
@pytest.mark.slow
def test_mechanism_gate_names_the_patches_whose_declaration_is_wrong(tmp_path: Path, cli: Any) -> None:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "overlays", root / "overlays")
    (root / "patches" / "mlx-lm").mkdir(parents=True)
    base = (REPO / "patches" / "mlx-lm" / "series").read_text().splitlines()[0]
    (root / "patches" / "mlx-lm" / "series").write_text(base + "\n")
    (root / "tests" / "check").mkdir(
        parents=True
    )  # the fixtures' Overlay-Check names this file: lint wants it
    shutil.copy(Path(__file__), root / "tests" / "check" / Path(__file__).name)
    (root / "build").mkdir()
    for d in ("cache", "venvs", "models"):
        (REPO / "build" / d).mkdir(parents=True, exist_ok=True)
        (root / "build" / d).symlink_to(REPO / "build" / d)
    wt = Path(cli("--root", str(root), "-q", "checkout", "mlx-lm").out.strip())
    llama, gen = wt / "mlx_lm" / "models" / "llama.py", wt / "mlx_lm" / "generate.py"
    assert HEADS in llama.read_text() and RETURN in gen.read_text() and YIELD in gen.read_text()
    llama.write_text(llama.read_text().replace(HEADS, ONE_TOKEN, 1))
    _commit(
        wt,
        "llama: one reshape per head tensor for a single token",
        "dispatch-fusion",
        "ops-per-token decreases in decode-token",
    )
    gen.write_text(
        gen.read_text().replace(
            RETURN, "            return mx.stop_gradient(sampled), logprobs.squeeze(0)\n", 1
        )
    )
    _commit(
        wt,
        "generate: claims fewer ops but adds one",
        "dispatch-fusion",
        "ops-per-token decreases in decode-token",
    )
    gen.write_text(gen.read_text().replace(YIELD, "            mx.eval(y)\n" + YIELD, 1))
    _commit(
        wt,
        "generate: claims fewer host syncs but adds an eval per token",
        "other",
        "evals-per-token decreases in decode-token",
    )
    assert cli("--root", str(root), "-q", "refresh", "mlx-lm").code == 0
    names = (root / "patches" / "mlx-lm" / "series").read_text().splitlines()[1:]
    assert len(names) == 3

    r = cli(
        "--root",
        str(root),
        "check",
        "mlx-lm",
        "--mechanism",
        "--model",
        str(_llama_random(root)),
        "--census-steps",
        "2",
    )
    assert r.code == 4, r.err + r.out
    report = json.loads((root / "build" / "reports" / "mlx-lm-check.json").read_text())
    assert report["mode"] == "mechanism" and report["verdict"] == "fail"
    by = {rec["patch"]: rec for rec in report["mechanism"]}
    good, more_ops, more_evals = (by[n] for n in names)
    assert good["holds"] is True and good["after"] < good["before"] == good["stock"]
    assert more_ops["holds"] is False and more_ops["after"] == more_ops["before"] + 1
    assert more_evals["holds"] is False and more_evals["after"] == more_evals["before"] + 1
    assert any("generate.py" in site and "eval" in site for site, _n in more_evals["sites"]["after"])
    failed = {g["subject"] for g in report["gates"] if not g["passed"]}
    assert failed == {names[1], names[2]}
    assert "DOES NOT HOLD" in r.out and names[2] in r.err
    html = (root / "build" / "reports" / "mlx-lm-check.html").read_text()
    assert "Mechanism census" in html and "What moved" in html and names[1] in html


def _llama_random(root: Path) -> Path:
    from overlay.check import models as tinymodels
    from overlay.check.envs import deps_env
    from overlay.core.manifest import load_engine

    python = deps_env(root, load_engine(root, "mlx-lm")) / "bin" / "python"
    return tinymodels.build("llama-random", root=root, python=python)
