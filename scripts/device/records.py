"""The device run's plan resolved against the series as it is, and its measurements turned into census records
(the shape of ``overlay check --mechanism``: patch, metric, direction, scenario, declared, flag, stock, patched,
flag_off, before, after, holds, sites, note; plus time). Driver side: imports overlay.

``resolve(root, engine)``: every declared ``Overlay-Mechanism`` of ``patches/ENGINE`` with the probe planned for it
(plan.probe_for, by patch-name prefix and scenario), or the reason one GPU cannot measure it (plan.NotOnOneGpu), or
"unplanned" (a gap: tests/census/test_device_plan.py fails on it). ``records(resolved, report)``: one record per
declared mechanism; ``holds`` is decided as the CPU census decides it (overlay.check.census_rules.decide): for an opt-in
patch between the patched arm with the flag off and on, for an always-on patch between stock and the whole series
(no series-prefix arms on the device).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))

import plan

from overlay.check.census import declared, switch_for
from overlay.check.census_rules import decide
from overlay.core.series import load_series


def declared_fields(engine: str, patch: Any, mech: Any, switch: Any) -> dict[str, Any]:
    """What every device record says of one declared mechanism: the patch, the claim and the switch that turns it
    on (records here and vllm_records.py)."""
    return {"engine": engine, **declared(patch, mech, switch), "default": switch.default}


def unmeasured(entry: dict[str, Any], note: str, *, probe: str | None = None, **extra: Any) -> dict[str, Any]:
    """A census record of a declared mechanism the device run did not measure (``extra``: fields of its own, after
    ``holds``), with why in ``note``."""
    return {
        **{k: entry[k] for k in ("patch", "metric", "direction", "scenario", "declared", "flag")},
        "probe": probe,
        "stock": None,
        "patched": None,
        "flag_off": None,
        "before": None,
        "after": None,
        "holds": None,
        **extra,
        "sites": {"stock": [], "patched": []},
        "time": None,
        "note": note,
    }


def resolve(root: Path, engine: str) -> dict[str, Any]:
    series = load_series(root / "patches" / engine)
    entries, not_measurable, unplanned = [], [], []
    for patch in series.patches:
        switch = switch_for(patch.flags)
        for mech in patch.mechanisms:
            base = {
                **declared_fields(engine, patch, mech, switch),
                "env": dict(switch.env),
                "options": dict(switch.options),
            }
            probe = plan.probe_for(engine, patch.name, mech.metric, mech.scenario)
            if probe is not None:
                entries.append({**base, "key": probe.key, "metrics": [mech.metric], "pending": probe.pending})
                continue
            reason = plan.not_on_one_gpu(engine, patch.name, mech.metric)
            if reason is not None:
                not_measurable.append({**base, "reason": reason.reason})
            else:
                unplanned.append(base)
    return {
        "engine": engine,
        "entries": entries,
        "not_on_one_gpu": not_measurable,
        "unplanned": unplanned,
        "keys": sorted({e["key"] for e in entries}),
    }


def _metric(report: dict[str, Any] | None, metric: str) -> Any:
    if not report:
        return None
    return (report.get("metrics") or {}).get(metric)


def _config(measurement: dict[str, Any], scenario: str, name: str) -> dict[str, Any]:
    return ((measurement.get("by_scenario") or {}).get(scenario) or {}).get("configs", {}).get(name) or {}


def records(resolved: dict[str, Any], report: dict[str, Any] | None) -> list[dict[str, Any]]:
    by_key = {m["key"]: m for m in (report or {}).get("measurements", [])}
    out: list[dict[str, Any]] = []
    for e in resolved["entries"]:
        rec: dict[str, Any] = {
            k: e[k] for k in ("patch", "metric", "direction", "scenario", "declared", "flag")
        }
        rec.update(
            probe=e["key"],
            stock=None,
            patched=None,
            flag_off=None,
            before=None,
            after=None,
            holds=None,
            sites={"stock": [], "patched": [], "before": [], "after": []},
            time=None,
            note=None,
        )
        m = by_key.get(e["key"])
        if e.get(
            "pending"
        ):  # planned, but this mechanism's region cannot run here: never judged from a neighbour's
            rec["note"] = f"not measured: pending: {e['pending']}"
            out.append(rec)
            continue
        if m is None:
            rec["note"] = "not measured: " + (
                (e.get("pending") and f"pending: {e['pending']}")
                or "the engine's device script did not run this probe"
            )
            out.append(rec)
            continue
        if m["status"] != "ok":
            rec["note"] = f"not measured: {m['status']}: {m.get('reason')}"
            out.append(rec)
            continue
        rows = {n: _config(m, e["scenario"], n) for n in ("stock", "flag_off")}
        rows["patched"] = _config(m, e["scenario"], "patched:" + e["flag"]) or _config(
            m, e["scenario"], "patched"
        )
        before_name = "stock" if e["default"] else "flag_off"
        rec["stock"], rec["flag_off"], rec["patched"] = (
            _metric(rows[n].get("report"), e["metric"]) for n in ("stock", "flag_off", "patched")
        )
        rec["before"], rec["after"] = rec[before_name], rec["patched"]
        errors = [f"{n}: {rows[n]['error']}" for n in (before_name, "patched") if rows[n].get("error")]
        if errors:
            rec["note"] = "not measured: " + "; ".join(errors)
        else:
            rec["holds"], why = decide(e["metric"], e["direction"], rec["before"], rec["after"])
            baseline = "stock -> patched (always on: the whole series)" if e["default"] else "flag off -> on"
            rec["note"] = f"{baseline}: {why}" if rec["holds"] is not None else f"not measured: {why}"
        if rows["stock"].get("error") and before_name != "stock":
            rec["note"] += f"; stock: {rows['stock']['error']}"
        for side, name in (
            ("stock", "stock"),
            ("patched", "patched"),
            ("before", before_name),
            ("after", "patched"),
        ):
            sites = ((rows[name].get("report") or {}).get("sites") or {}).get(e["metric"], [])
            rec["sites"][side] = sites
            capture = rows[name].get("capture")
            if e["metric"] == "capturable" and capture and capture.get("site"):
                rec["sites"][side] = [[capture["site"], 1]]
        for name in ("stock", "flag_off", "patched"):
            capture = rows[name].get("capture")
            if e["metric"] == "capturable" and capture and capture.get("error"):
                rec.setdefault("capture_errors", {})[name] = capture["error"]
        timing = ((m.get("by_scenario") or {}).get(e["scenario"]) or {}).get("time") or {}
        side = "stock" if e["default"] else "flag_off"
        rec["time"] = timing.get(f"{side}_vs_patched:{e['flag']}") or timing.get(f"{side}_vs_patched")
        equal = ((m.get("by_scenario") or {}).get(e["scenario"]) or {}).get("equal") or {}
        rec["equal"] = {
            k: v
            for k, v in equal.items()
            if k.endswith(("_vs_patched", f"_vs_patched:{e['flag']}")) or k == "stock_vs_flag_off"
        }
        out.append(rec)
    for n in resolved["not_on_one_gpu"]:
        out.append(unmeasured(n, f"not measured: not on one GPU ({n['reason']})"))
    for u in resolved["unplanned"]:
        out.append(
            unmeasured(
                u, "not measured: no device probe is planned for this mechanism (scripts/device/plan.py)"
            )
        )
    return out


def summary(recs: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "declared": len(recs),
        "hold": sum(r["holds"] is True for r in recs),
        "do_not_hold": sum(r["holds"] is False for r in recs),
        "not_measured": sum(r["holds"] is None for r in recs),
    }
