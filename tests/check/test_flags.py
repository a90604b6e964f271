"""Flags as data: `--flags all|none|NAME,...` picks the Overlay-Flag values the patched arm runs with, and the gate
class comes from the patches those flags make active."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from overlay.check.envs import Arm
from overlay.check.flags import choose, opt_in_flags
from overlay.check.options import CheckOptions, series_class
from overlay.check.run import _FlaggedAdapter
from overlay.core.series import Patch, parse_patch_bytes
from overlay.errors import UsageError
from overlay.schemas.documents import WorkerRequest

REPO = Path(__file__).resolve().parents[2]


def _patch(n: int, numerics: str, *flags: str) -> Patch:
    trailers = "".join(f"Overlay-Flag: {f}\n" for f in flags)
    raw = (
        f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"From: T <t@example.com>\nDate: Mon, 1 Jan 2024 00:00:00 +0000\nSubject: [PATCH] p{n}\n\n"
        f"body\n\nOverlay-Theme: other\nOverlay-Numerics: {numerics}\n{trailers}---\n"
        f" a{n}.py | 1 +\n 1 file changed, 1 insertion(+)\n\n"
        f"diff --git a/a{n}.py b/a{n}.py\nindex 0000000..1111111 100644\n--- a/a{n}.py\n+++ b/a{n}.py\n"
        f"@@ -1 +1,2 @@\n x = 1\n+y = 2\n-- \n2.40.0\n"
    ).encode()
    return parse_patch_bytes(raw, name=f"{n:04d}-p{n}.patch")


@pytest.fixture
def series() -> list[Patch]:
    return [
        _patch(1, "exact", "default"),
        _patch(2, "approximate", "DEMO_FAST=1"),
        _patch(3, "lossless", "--spec-mode=tree"),
        _patch(4, "exact", "DEMO_FAST=1", "--spec-mode=tree"),
        _patch(5, "exact"),
    ]


def test_fixture_patches_parse_their_flags(series: list[Patch]) -> None:
    assert [f.text for f in series[3].flags] == ["DEMO_FAST=1", "--spec-mode=tree"]
    assert [f.text for f in opt_in_flags(series)] == ["DEMO_FAST=1", "--spec-mode=tree"]


def test_none_leaves_opt_in_patches_out_of_the_gate_class(series: list[Patch]) -> None:
    c = choose(series, "none", engine="demo")
    assert [p.name[:4] for p in c.active] == [
        "0001",
        "0005",
    ]  # default and trailer-less patches are always on
    assert series_class(c.active) == "exact" and series_class(series) == "approximate"
    assert c.env == {} and c.options == {}
    rep = c.report()
    assert rep["inactive_patches"] == [p.name for p in series[1:4]]
    assert all(n["why"].startswith("flag off") for n in rep["not_exercised"])


def test_all_sets_env_and_options_and_counts_every_patch(series: list[Patch]) -> None:
    c = choose(series, "all", engine="demo")
    assert len(c.active) == 5 and series_class(c.active) == "approximate"
    assert c.env == {"DEMO_FAST": "1"} and c.options == {"--spec-mode": "tree"}
    # a CLI option does not reach greedy/logits/speed: its patches are active, not exercised, not in the gate class
    assert [p.name[:4] for p in c.exercised] == ["0001", "0002", "0005"]
    cli_rows = [n for n in c.report()["not_exercised"] if n["flags"] == ["--spec-mode=tree"]]
    assert [n["patch"][:4] for n in cli_rows] == ["0003", "0004"] and "CLI option" in cli_rows[0]["why"]


def test_a_patch_needing_two_flags_is_active_only_with_both(series: list[Patch]) -> None:
    c = choose(series, "DEMO_FAST", engine="demo")
    assert [p.name[:4] for p in c.active] == ["0001", "0002", "0005"]
    c2 = choose(series, "DEMO_FAST=1,spec-mode", engine="demo")  # NAME=VALUE and a CLI option without dashes
    assert [p.name[:4] for p in c2.active] == ["0001", "0002", "0003", "0004", "0005"]
    only_cli = choose(series, "--spec-mode", engine="demo")
    assert series_class(only_cli.active) == "lossless" and series_class(only_cli.exercised) == "exact"


def test_unknown_flag_is_a_usage_error_with_a_suggestion(series: list[Patch]) -> None:
    with pytest.raises(UsageError, match="'DEMO_FAS' is not an Overlay-Flag of the demo series") as exc:
        choose(series, "DEMO_FAS", engine="demo")
    assert "did you mean 'DEMO_FAST'" in str(exc.value) and "DEMO_FAST=1" in (exc.value.tip or "")
    assert exc.value.return_code == 2
    with pytest.raises(UsageError, match="empty name"):
        choose(series, "DEMO_FAST,,", engine="demo")


def test_real_mlx_lm_series_flags() -> None:
    from overlay.core.series import load_series

    patches = list(load_series(REPO / "patches" / "mlx-lm").patches)
    names = {f.name for f in opt_in_flags(patches)}
    assert {"MLX_LM_FUSED_PROJ", "MLX_LM_KEEP_MTP", "--keep-mtp"} <= names
    c = choose(patches, "MLX_LM_KEEP_MTP", engine="mlx-lm")
    assert c.env == {"MLX_LM_KEEP_MTP": "1"}
    assert sum("MLX_LM_KEEP_MTP=1" in [f.text for f in p.flags] for p in c.active) >= 2


def test_cli_unknown_flag_exits_2_before_anything_runs(cli: Any) -> None:
    r = cli("--root", str(REPO), "check", "mlx-lm", "--flags", "MLX_LM_NOPE")
    assert r.code == 2 and "MLX_LM_NOPE" in r.err and "is not an Overlay-Flag" in r.err


class _Recorder:
    engine = "demo"

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def run(self, arm: Arm, request: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        self.requests.append((arm.name, request))
        return {}


def test_cli_options_reach_the_patched_arms_requests_only(tmp_path: Path) -> None:
    rec = _Recorder()
    ad = _FlaggedAdapter(rec, {"--spec-mode": "tree"}, {"patched"})  # type: ignore[arg-type]

    def mk(name: str) -> Arm:
        return Arm(name=name, engine="demo", venv=tmp_path, wheel=tmp_path / "w.whl", version="1")

    greedy = cast(WorkerRequest, {"task": "greedy"})
    ad.run(mk("stock"), greedy)
    ad.run(mk("patched"), greedy)
    ad.run(
        mk("patched"), cast(WorkerRequest, {"task": "census", "options": {"--x": None}})
    )  # sets its own per patch
    assert rec.requests[0][1] == {"task": "greedy"}
    assert rec.requests[1][1]["options"] == {"--spec-mode": "tree"}
    assert rec.requests[2][1]["options"] == {"--x": None}


def test_mechanism_gate_is_on_by_default() -> None:
    assert CheckOptions(engine="x").mechanism_gated is True
    assert CheckOptions(engine="x", gate_mechanism=False).mechanism_gated is False
    from overlay.cli.main import build_parser

    args = build_parser().parse_args(["check", "mlx-lm", "--no-gate-mechanism"])
    assert args.gate_mechanism is False
    assert build_parser().parse_args(["check", "mlx-lm"]).gate_mechanism is None


class _NoCensus:
    engine = "demo"

    def census_scenarios(self) -> tuple[str, ...]:
        return ()

    def run(self, arm: Arm, request: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        raise AssertionError("no census run expected")


@pytest.mark.parametrize("gate", [None, False])
def test_the_report_says_when_the_mechanism_gate_is_off(
    tmp_path: Path, series: list[Patch], gate: bool | None
) -> None:
    from overlay.check.steps import mechanism_step
    from overlay.progress import NullReporter

    arm = Arm(name="stock", engine="demo", venv=tmp_path, wheel=tmp_path / "w.whl", version="1")
    report: dict[str, Any] = {"engine": "demo", "notes": []}
    gates: list[dict[str, Any]] = []
    mechanism_step(
        report,
        gates,
        root=tmp_path,
        adapter=_NoCensus(),  # type: ignore[arg-type]
        stock=arm,
        patched=arm,
        patches=series,
        models=None,
        options=CheckOptions(engine="demo", gate_mechanism=gate),
        reporter=NullReporter(),
    )
    assert report["mechanism_summary"]["gated"] is (gate is None)
    off = [n for n in report["notes"] if "NOT GATED" in n]
    assert bool(off) is (gate is False)
