"""The census records as a verdict: counts, failed gates, terminal lines, and what moved most (sites, primitives)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from overlay.check.census_rules import TOLERANCE, fmt


def summary(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    return {
        "declared": len(records),
        "hold": sum(r["holds"] is True for r in records),
        "do_not_hold": sum(r["holds"] is False for r in records),
        "not_measured": sum(r["holds"] is None for r in records),
    }


def gates(records: Sequence[dict[str, Any]], *, enforce: bool = True) -> list[dict[str, Any]]:
    """A failed gate per declared mechanism that does not hold (none when not ``enforce``d)."""
    out = []
    for r in records:
        if r["holds"] is False and enforce:
            out.append(
                {
                    "subject": r["patch"],
                    "class": "mechanism",
                    "gate": r["declared"],
                    "passed": False,
                    "detail": f"stock {fmt(r['stock'])}, patched {fmt(r['patched'])} (flag {r['flag']}); "
                    f"{r['note']}",
                }
            )
    return out


def top_sites_diff(record: dict[str, Any], top: int = 6) -> list[tuple[str, float, float]]:
    """Where the metric moved, from before to after the patch: (site, before, after), largest changes first."""
    sites = record.get("sites") or {}
    s = {k: float(v) for k, v in sites.get("before", sites.get("stock", []))}
    p = {k: float(v) for k, v in sites.get("after", sites.get("patched", []))}
    rows = [(k, s.get(k, 0.0), p.get(k, 0.0)) for k in set(s) | set(p)]
    rows = [r for r in rows if abs(r[2] - r[1]) > TOLERANCE]
    rows.sort(key=lambda r: (-abs(r[2] - r[1]), r[0]))
    return rows[:top]


def top_primitives_diff(record: dict[str, Any], top: int = 8) -> list[tuple[str, float, float]]:
    """Which primitives moved, from before to after (from the engines that report a histogram in ``detail``)."""
    detail = record.get("detail") or {}
    hist = [
        {k: float(v) for k, v in ((detail.get(side) or {}).get("primitives") or [])}
        for side in ("before", "after")
    ]
    rows = [(k, hist[0].get(k, 0.0), hist[1].get(k, 0.0)) for k in set(hist[0]) | set(hist[1])]
    rows = [r for r in rows if abs(r[2] - r[1]) > TOLERANCE]
    rows.sort(key=lambda r: (-abs(r[2] - r[1]), r[0]))
    return rows[:top]


def line(record: dict[str, Any]) -> str:
    """One terminal line per record."""
    verdict = {True: "holds", False: "DOES NOT HOLD", None: "not measured"}[record["holds"]]
    return (
        f"mechanism {verdict:<13} {record['patch'][:48]}: {record['declared']} [flag {record['flag']}] "
        f"stock {fmt(record['stock'])} patched {fmt(record['patched'])}"
        + (f"  ({record['note']})" if record.get("note") else "")
    )
