"""The vLLM device check's plan resolved against the series as it is, and its report turned into census records
(driver side: imports overlay). The shapes follow records.py (SGLang, ExLlamaV3); what differs is what one GPU can say
about this series.

Every declared mechanism of patches/vllm is a CPU-census claim of a patch that gates itself to the CPU path (or, for
0002/0003, of the engine's cold start, which the device does not run): the GPU does not measure it, so each record
has ``holds`` None and says why, with the patch's gate (plan.VLLM_CPU_PATH_ONLY). What the device measures instead is
``neutral``: whether CUDA takes stock's path with every flag of the series set (vllm_check.py); a record carries its
probe's verdict there, and the run fails on a False one (a patch that changes CUDA where it says it does not).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))

import plan
from records import declared_fields, unmeasured

from overlay.check.census import switch_for
from overlay.core.series import load_series


def resolve(root: Path) -> dict[str, Any]:
    """Per patch: its switch, gate and the probes that check its CUDA side; per declared mechanism an entry; and
    ``flags``, every environment switch of the series (the device check sets them all)."""
    series = load_series(root / "patches" / "vllm")
    flags: dict[str, str] = {}
    patches, entries, unplanned = [], [], []
    for patch in series.patches:
        switch = switch_for(patch.flags)
        flags.update(switch.env)
        cpu = plan.vllm_cpu_path_only(patch.name)
        probes = [p.key for p in plan.vllm_probes_for(patch.name)]
        patches.append(
            {"patch": patch.name, "flag": switch.text, "gate": cpu.gate if cpu else None, "probes": probes}
        )
        if cpu is None and not probes:
            unplanned.append(patch.name)
        for mech in patch.mechanisms:
            entries.append(
                {
                    **declared_fields("vllm", patch, mech, switch),
                    "gate": cpu.gate if cpu else None,
                    "probes": probes,
                }
            )
    return {"engine": "vllm", "flags": flags, "patches": patches, "entries": entries, "unplanned": unplanned}


def _imports_note(report: dict[str, Any] | None) -> str | None:
    m = next((m for m in (report or {}).get("measurements", []) if m["key"] == "imports"), None)
    if not m or not m.get("by_config"):
        return None
    parts = []
    for cfg in ("stock", "patched"):
        imp = m["by_config"].get(cfg) or {}
        marks = [k for k, v in (imp.get("markers") or {}).items() if v]
        parts.append(
            f"{cfg} {imp.get('vllm_modules')} vLLM modules ({', '.join(marks) or 'none of the markers'})"
        )
    return "importing the probed modules on the device: " + "; ".join(parts)


def records(resolved: dict[str, Any], report: dict[str, Any] | None) -> list[dict[str, Any]]:
    by_key = {m["key"]: m for m in (report or {}).get("measurements", [])}
    dry = bool((report or {}).get("dry_run"))
    words = (
        {
            True: "the CPU path equals stock's",
            False: "differs from stock on the CPU (dry run: expected)",
            None: "not run",
        }
        if dry
        else {True: "CUDA unchanged", False: "CUDA CHANGED", None: "not measured"}
    )
    out = []
    for e in resolved["entries"]:
        verdicts = {k: (by_key.get(k) or {}).get("neutral") for k in e["probes"] if k != "imports"}
        neutral: bool | None
        if any(v is False for v in verdicts.values()):
            neutral = False
        elif verdicts and all(v is True for v in verdicts.values()):
            neutral = True
        else:
            neutral = None
        why = (
            f"CPU path only (gate: {e['gate']})"
            if e["gate"]
            else "a cold-start mechanism of the engine, whose start the device does not run"
        )
        checks = "; ".join(
            f"{k}: "
            + words[v]
            + (
                f" ({(by_key.get(k) or {}).get('reason')})"
                if v is None and (by_key.get(k) or {}).get("reason")
                else ""
            )
            for k, v in verdicts.items()
        )
        if "imports" in e["probes"]:
            checks = "; ".join(filter(None, [checks, _imports_note(report)]))
        out.append(
            unmeasured(
                e,
                f"not measured on the GPU: {why}" + (f"; {checks}" if checks else ""),
                probe=",".join(e["probes"]) or None,
                neutral=neutral,
            )
        )
    return out


def neutral_failures(report: dict[str, Any] | None, *, dry_run: bool) -> list[str]:
    """The probes whose CUDA side is not stock's (never on a dry run: the CPU path is meant to differ)."""
    if dry_run or not report:
        return []
    return [m["key"] for m in report.get("measurements", []) if m.get("neutral") is False]


def summary(recs: list[dict[str, Any]], report: dict[str, Any] | None) -> dict[str, Any]:
    probes = [m for m in (report or {}).get("measurements", []) if "neutral" in m and m["key"] != "imports"]
    return {
        "declared": len(recs),
        "hold": 0,
        "do_not_hold": 0,
        "not_measured": len(recs),
        "neutral_probes": sum(m.get("neutral") is True for m in probes),
        "not_neutral_probes": sum(m.get("neutral") is False for m in probes),
        "unmeasured_probes": sum(m.get("neutral") is None for m in probes),
    }
