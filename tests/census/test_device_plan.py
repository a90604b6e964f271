"""The device run's plan (scripts/device/plan.py) against the series and docs/engines/mechanisms.md, its budget, and
the census records the driver makes of the engines' device reports (scripts/device/records.py)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEVICE = REPO / "scripts" / "device"


def _load(name: str, path: Path) -> ModuleType:
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


plan = _load("plan", DEVICE / "plan.py")
records = _load("records", DEVICE / "records.py")

ROW = re.compile(r"^\| `(?P<patch>\d{4}-[^`]+\.patch)` \| (?P<flag>[^|]+) \| (?P<mechs>[^|]+) \|")


def declared_in_docs(engine: str) -> list[tuple[str, str, str, str]]:
    """(patch, metric, direction, scenario) of every mechanism the engine's table in mechanisms.md declares."""
    text = (REPO / "docs" / "engines" / "mechanisms.md").read_text()
    title = {"sglang": "## SGLang", "exllamav3": "## ExLlamaV3"}[engine]
    section = text.split(title, 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        for mech in re.findall(r"`([^`]+)`", m.group("mechs")):
            metric, direction, _in, scenario = mech.split()
            out.append((m.group("patch"), metric, direction, scenario))
    return out


@pytest.mark.parametrize("engine", ["sglang", "exllamav3"])
def test_every_declared_mechanism_has_a_device_measurement_planned(engine: str) -> None:
    declared = declared_in_docs(engine)
    assert len(declared) >= 5, f"the {engine} table of mechanisms.md was not read ({len(declared)} rows)"
    gaps = []
    for patch, metric, _direction, scenario in declared:
        probe = plan.probe_for(engine, patch, metric, scenario)
        if probe is None and plan.not_on_one_gpu(engine, patch, metric) is None:
            gaps.append(f"{patch}: {metric} in {scenario}")
    assert not gaps, (
        "declared mechanisms with no device probe planned (scripts/device/plan.py):\n" + "\n".join(gaps)
    )


@pytest.mark.parametrize("engine", ["sglang", "exllamav3"])
def test_the_series_as_it_is_resolves_with_no_gap(engine: str) -> None:
    resolved = records.resolve(REPO, engine)
    assert resolved["unplanned"] == []
    assert resolved["entries"], "no planned mechanism resolved from patches/" + engine
    for e in resolved["entries"]:  # the flag travels from the trailers, not from the plan
        assert e["flag"] and (e["default"] or e["env"] or e["options"]), e


def test_only_what_one_gpu_cannot_measure_is_left_out() -> None:
    for n in plan.NOT_ON_ONE_GPU:
        assert n.metric == "collectives" or re.search(r">= 2|several|pipeline", n.reason), n
    # everything GPU-measurable that cannot run here is still planned and says why
    for p in plan.PROBES:
        if p.pending:
            assert len(p.pending) > 30, p


def test_every_runnable_probe_has_an_implementation() -> None:
    sglang_check = _load("sglang_check", DEVICE / "sglang_check.py")
    exl3 = _load("exllamav3_check", DEVICE / "exllamav3_check.py")
    for p in plan.PROBES:
        if p.pending:
            continue
        if p.engine == "sglang":
            assert p.key in sglang_check.PROBES, p.key
        else:
            request = exl3.request_for(p.key, "patched", {"options": {"--draft_window": "512"}}, True)
            assert request["mode"] in ("spec", "script") and request["dry_run"] is True


def test_budget_plan_skips_what_does_not_fit_with_the_reason() -> None:
    full = plan.budget_plan("sglang", 10_000)
    assert all(x.run for x in full if not x.probe.pending)
    assert all(not x.run and x.reason.startswith("pending:") for x in full if x.probe.pending)
    tight = plan.budget_plan("sglang", 30)
    ran = [x for x in tight if x.run]
    assert sum(x.probe.seconds for x in ran) <= 30
    skipped = [x for x in tight if not x.run and not x.probe.pending]
    assert skipped and all(x.reason.startswith("over budget") and "left of 30 s" in x.reason for x in skipped)
    only = plan.budget_plan("sglang", 10_000, keys={"topk-topp-sample"})
    assert [x.probe.key for x in only if x.run] == ["topk-topp-sample"]


def test_the_default_run_fits_one_device_command_and_the_session() -> None:
    assert plan.DEFAULT_BUDGET_S <= 600 - 45, "one device command may run 10 minutes; keep a margin"
    split = plan.split_budget(plan.DEFAULT_BUDGET_S)
    assert (
        split["setup"] + max(split["sglang"], split["exllamav3_build"]) + split["exllamav3"] + split["report"]
        <= plan.DEFAULT_BUDGET_S
    )
    # SGLang's whole plan runs inside its share; ExLlamaV3's builds run beside it, in the background
    sg = sum(x.probe.seconds for x in plan.budget_plan("sglang", split["sglang"]) if x.run)
    assert sg == sum(p.seconds for p in plan.probes("sglang") if not p.pending)
    # a 15-minute session: machine start (~2 min) + this run + a warm rerun of what was skipped must be possible
    assert 120 + plan.DEFAULT_BUDGET_S + 60 <= 900


def test_patch_keys_survive_renumbering() -> None:
    assert plan.slug("0004-sampler-Gumbel-max-sampling-after-the-pytorch-top-k-.patch").startswith(
        "sampler-Gumbel-max"
    )
    probe = plan.probe_for(
        "sglang",
        "0099-sampler-Gumbel-max-sampling-after-the-pytorch-top-k-.patch",
        "eager-launches",
        "decode-step-sampled",
    )
    assert probe is not None and probe.key == "topk-topp-sample"
    assert (
        plan.probe_for(
            "sglang",
            "0005-sampler-Gumbel-max-sampling-after-the-pytorch-top-k-.patch",
            "eager-launches",
            "decode-step",
        )
        is None
    )  # the scenario is part of the key


def _entry(**kw: Any) -> dict[str, Any]:
    base = {
        "engine": "sglang",
        "patch": "0006-x.patch",
        "metric": "eager-launches",
        "direction": "decreases",
        "scenario": "draft-round",
        "declared": "eager-launches decreases in draft-round",
        "flag": "SGLANG_OPT_CHAIN_TREE=1",
        "env": {"SGLANG_OPT_CHAIN_TREE": "1"},
        "options": {},
        "default": False,
        "key": "chain-tree",
        "metrics": ["eager-launches"],
        "pending": None,
    }
    return {**base, **kw}


def _report(key: str, configs: dict[str, Any], scenario: str = "draft-round") -> dict[str, Any]:
    return {
        "measurements": [
            {
                "key": key,
                "status": "ok",
                "by_scenario": {
                    scenario: {
                        "configs": configs,
                        "equal": {"flag_off_vs_patched": True},
                        "time": {
                            "flag_off_vs_patched": {
                                "stock_us": 10.0,
                                "patched_us": 5.0,
                                "ratio": 2.0,
                                "ci": [1.8, 2.2],
                            }
                        },
                    }
                },
            }
        ]
    }


def _cfg(value: Any, metric: str = "eager-launches", site: str = "sglang/x.py:1") -> dict[str, Any]:
    return {"report": {"metrics": {metric: value}, "sites": {metric: [[site, value]]}}, "error": None}


def test_records_judge_flag_off_against_flag_on_in_the_census_shape() -> None:
    resolved = {"entries": [_entry()], "not_on_one_gpu": [], "unplanned": []}
    (rec,) = records.records(
        resolved, _report("chain-tree", {"stock": _cfg(30), "flag_off": _cfg(30), "patched": _cfg(28)})
    )
    for key in ("patch", "metric", "scenario", "flag", "stock", "patched", "declared", "holds", "sites"):
        assert key in rec
    assert (rec["before"], rec["after"], rec["holds"]) == (30, 28, True)
    assert rec["time"]["ratio"] == 2.0 and rec["sites"]["after"] == [["sglang/x.py:1", 28]]
    (worse,) = records.records(
        resolved, _report("chain-tree", {"stock": _cfg(8), "flag_off": _cfg(8), "patched": _cfg(22)})
    )
    assert worse["holds"] is False and "does not decrease" in worse["note"]


def test_records_never_count_a_failed_or_missing_side_as_holding() -> None:
    resolved = {
        "entries": [_entry(), _entry(patch="0013-y.patch", key="splitk-fp8-gemm", pending=None)],
        "not_on_one_gpu": [{**_entry(patch="0009-z.patch", metric="collectives"), "reason": "one rank"}],
        "unplanned": [],
    }
    failed = {
        "stock": _cfg(30),
        "flag_off": {"report": None, "error": "ImportError: sgl_kernel"},
        "patched": _cfg(1),
    }
    recs = records.records(resolved, _report("chain-tree", failed))
    assert [r["holds"] for r in recs] == [None, None, None]
    assert "sgl_kernel" in recs[0]["note"]
    assert "did not run this probe" in recs[1]["note"] and "not on one GPU" in recs[2]["note"]
    assert records.summary(recs) == {"declared": 3, "hold": 0, "do_not_hold": 0, "not_measured": 3}


def test_records_of_an_always_on_patch_compare_stock_with_the_series() -> None:
    entry = _entry(
        flag="default",
        env={},
        default=True,
        direction="unchanged",
        declared="eager-launches unchanged in draft-round",
    )
    (rec,) = records.records(
        {"entries": [entry], "not_on_one_gpu": [], "unplanned": []},
        _report("chain-tree", {"stock": _cfg(5), "flag_off": _cfg(5), "patched": _cfg(5)}),
    )
    assert rec["holds"] is True and rec["note"].startswith("stock -> patched")


def test_a_pending_mechanism_is_never_judged_from_its_probes_other_configurations() -> None:
    entry = _entry(
        patch="0005-q.patch", pending="the probe takes no quantized cache", flag="--draft_cache_quant=8"
    )
    (rec,) = records.records(
        {"entries": [entry], "not_on_one_gpu": [], "unplanned": []},
        _report("chain-tree", {"stock": _cfg(9), "flag_off": _cfg(9), "patched": _cfg(9)}),
    )
    assert rec["holds"] is None and "pending: the probe takes no quantized cache" in rec["note"]
