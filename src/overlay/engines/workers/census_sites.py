"""How a census names a call site's file, the same on the CPU (torch_census) and the GPU (cuda_census): inside
site-packages, or relative to the working folder; and the op names both count the same way (GEMM_OPS). No torch here,
so the GPU instrument's pure parts import it too."""

from __future__ import annotations

import os
from typing import Any

# the matrix-multiply aten ops whose operands gemm-bytes sums (matmul, linear and einsum decompose into these); at
# decode batch sizes a GEMM is bound by reading its weight, so these bytes are its memory traffic
GEMM_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "_scaled_mm",
        "_int_mm",
        "_weight_int8pack_mm",
        "_weight_int4pack_mm",
    }
)


def relative(path: str) -> str:
    marker = "site-packages" + os.sep
    if marker in path:
        return path.rsplit(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def flag_notes(prefix: str, read: set[str] | list[str], where: str) -> tuple[list[str], bool]:
    """The census notes on a patch's switches (the environment variables starting with ``prefix``): which are set,
    and whether one of them was set but never ``read`` by the engine ``where`` (``"during the steps (...)"``): then
    the second value is True and every metric of the record must be None, because whatever the counts say, they are
    not the patch's effect."""
    flags = sorted(k for k in os.environ if k.startswith(prefix))
    notes = ["flags: " + (", ".join(f"{k}={os.environ[k]}" for k in flags) or "none")]
    unread = [k for k in flags if k not in read]
    if unread:
        notes.append(f"not measured: {', '.join(unread)} set but never read {where}")
    return notes, bool(unread)


def judged_flags(
    prefix: str, read: set[str] | list[str], where: str, metrics: dict[str, Any]
) -> tuple[list[str], dict[str, Any]]:
    """``flag_notes`` and the metrics as they may be reported: every one None when a set switch was never read."""
    notes, unread = flag_notes(prefix, read, where)
    return notes, (dict.fromkeys(metrics) if unread else metrics)


def census_record(
    scenario: str,
    report: dict[str, Any],
    metrics: dict[str, Any],
    notes: list[str],
    *,
    detail: dict[str, Any],
    standin: Any,
    steps: int | None = None,
) -> dict[str, Any]:
    """A census task's result for one scenario, from the torch census's ``report`` (steps, sites, kinds, per_step,
    the raw metrics) and the judged ``metrics``; ``detail`` adds the engine's own fields, ``steps`` the number asked
    for (a note says when fewer ran)."""
    if steps is not None and report["steps"] < steps:
        notes = [*notes, f"only {report['steps']} of {steps} steps ran"]
    return {
        "scenario": scenario,
        "steps": report["steps"],
        "metrics": metrics,
        "sites": report["sites"],
        "detail": {
            "kinds": report["kinds"],
            "per_step": report["per_step"],
            "uncounted": report["metrics"],
            **detail,
        },
        "notes": notes,
        "standin": standin,
    }
