"""The mechanism census of `overlay check`: does each patch change what its ``Overlay-Mechanism`` trailers say?

For every declared mechanism (``METRIC DIRECTION in SCENARIO``) the engine adapter's ``census`` task runs in the
stock arm, in the patched arm (the whole series) with the patch's ``Overlay-Flag`` on and, for an opt-in patch, with
it off; same scenario, same inputs, each configuration once (cached per arm, scenario, environment and options).

The patch's own effect is what is judged, never another patch of the series: ``holds`` compares ``before`` with
``after``, where for an opt-in patch (an env or CLI flag) before/after are the patched arm with the flag off/on, and for
an always-on patch (``Overlay-Flag: default``) they are the series prefixes without and with it (``overlay apply
--upto``; the prefix without patch 1 is stock). The direction decides:

- ``decreases`` / ``increases``: after below / above before.
- ``unchanged``: equal within ``TOLERANCE`` (census counts are deterministic per step; averages of integers), or
  within ``RELATIVE_TOLERANCE`` of before for the metrics read from an allocator (peak-memory, bytes-moved); a
  decrease or increase must exceed the same bound.
- ``becomes-true``: before false or null, after true.

A scenario the engine cannot run here, a metric its census does not count, or a census task that fails gives
``holds: None`` with the reason: "not measured", never counted as holding. Pure: no printing; the caller reports.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from overlay.check.envs import Arm
from overlay.core.mechanism import BOOLEAN_METRICS, Flag, Mechanism
from overlay.core.series import Patch
from overlay.errors import OverlayError
from overlay.schemas.documents import CensusRequest, WorkerRequest

TOLERANCE = 1e-6  # absolute, per step: counts are exact integers averaged over the census steps
# Relative noise floors of the metrics read from an allocator, not counted: which buffers are alive at a high-water
# mark depends on how a backend's worker thread and the caller interleave (mlx's CPU stream frees an evaluation's
# intermediates while the next are allocated). Measured on mlx[cpu], llama-random, repeated stock runs: peak-memory
# within 0.3%, bytes-moved (per step, 4 steps) within 20%.
RELATIVE_TOLERANCE = {"peak-memory": 0.01, "bytes-moved": 0.3}


def tolerance(metric: str | None, ref: float) -> float:
    """The smallest change of ``metric`` from ``ref`` that counts as a change."""
    return max(TOLERANCE, RELATIVE_TOLERANCE.get(metric or "", 0.0) * abs(ref))


DEFAULT_STEPS = 4

RunTask = Callable[[Arm, WorkerRequest], dict[str, Any]]


@dataclass(frozen=True)
class Switch:
    """How one patch's flags turn it on in an arm process: environment variables and CLI-style options."""

    env: tuple[tuple[str, str], ...] = ()
    options: tuple[tuple[str, str | None], ...] = ()
    default: bool = True  # every flag is `default` (or there is none): the patch is always on

    @property
    def text(self) -> str:
        parts = [f"{k}={v}" for k, v in self.env] + [k if v is None else f"{k}={v}" for k, v in self.options]
        return " ".join(parts) if parts else "default"


def switch_for(flags: Sequence[Flag]) -> Switch:
    env = tuple(sorted((k, v) for f in flags for k, v in f.environ.items()))
    options = tuple(sorted((f.name, f.value) for f in flags if f.kind == "cli"))
    return Switch(env=env, options=options, default=not env and not options)


def decide(metric: str, direction: str, before: Any, after: Any) -> tuple[bool | None, str]:
    """``holds`` for one declared mechanism (before: without the patch's effect, after: with it), and why (a short
    phrase). None: not measured."""
    if metric in BOOLEAN_METRICS or direction == "becomes-true":
        if after is None:
            return None, f"{metric} not measured with the patch"
        if direction == "becomes-true":
            ok = after is True and not before
            return ok, f"{before} -> {after}"
        return bool(after) == bool(before), f"{before} -> {after}"
    if not _is_number(before) or not _is_number(after):
        return None, f"{metric} not counted ({before} -> {after})"
    ok = _moves(direction, float(before), float(after), tolerance(metric, float(before)))
    return ok, f"{_fmt(before)} -> {_fmt(after)}" + ("" if ok else f": does not {direction[:-1]}")


def _moves(direction: str, ref: float, value: float, tol: float = TOLERANCE) -> bool:
    if direction == "decreases":
        return value < ref - tol
    if direction == "increases":
        return value > ref + tol
    if direction == "unchanged":
        return abs(value - ref) <= tol
    raise ValueError(f"unknown direction {direction!r}")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class Variant:
    """One census configuration: a model and extra request fields (e.g. a sampler), the same in every arm."""

    name: str
    model: str
    extra: tuple[tuple[str, Any], ...] = ()
    scenarios: tuple[str, ...] = ()  # the scenarios it applies to (empty: all)

    def applies(self, scenario: str) -> bool:
        return not self.scenarios or scenario in self.scenarios


class Census:
    """Runs census tasks, once per (arm, scenario, environment, options, variant)."""

    def __init__(self, run: RunTask, *, variants: Sequence[Variant], steps: int = DEFAULT_STEPS) -> None:
        self._run = run
        self.variants = tuple(variants)
        self.steps = steps
        self._cache: dict[str, dict[str, Any]] = {}
        self.runs = 0

    def measure(self, arm: Arm, scenario: str, switch: Switch | None, variant: Variant) -> dict[str, Any]:
        """The census result, or ``{"error": why}`` when the task failed."""
        env = dict(switch.env) if switch else {}
        options = dict(switch.options) if switch else {}
        key = json.dumps(
            [
                arm.name,
                str(arm.venv),
                scenario,
                sorted(env.items()),
                sorted(options.items()),
                variant.name,
                variant.model,
                repr(variant.extra),
            ]
        )
        if key not in self._cache:
            run_arm = dataclasses.replace(arm, env={**arm.env, **env}) if env else arm
            request = cast(
                CensusRequest,
                {
                    "task": "census",
                    "model": variant.model,
                    "scenario": scenario,
                    "steps": self.steps,
                    **dict(variant.extra),
                },
            )
            if options:
                request["options"] = options
            try:
                self._cache[key] = self._run(run_arm, request)
            except OverlayError as exc:
                text = str(exc).strip()
                self._cache[key] = {"error": text.splitlines()[-1][:300] if text else repr(exc)}
            self.runs += 1
        return self._cache[key]


def _value(result: dict[str, Any], metric: str) -> Any:
    return (result.get("metrics") or {}).get(metric)


Label = Callable[[Mechanism, dict[str, Any], dict[str, Any]], str | None]
PrefixArm = Callable[[int], Arm]  # the arm of the series' first N patches (0: stock)


def _against(direction: str, before: Any, after: Any, metric: str | None = None) -> bool:
    """``after`` moved opposite to the declared direction (or, for becomes-true, became false)."""
    if direction == "becomes-true":
        return before is True and after is not True
    if not _is_number(before) or not _is_number(after):
        return False
    tol = tolerance(metric, float(before))
    if direction == "decreases":
        return float(after) > float(before) + tol
    if direction == "increases":
        return float(after) < float(before) - tol
    return False


def aggregate(
    direction: str, per_variant: Sequence[dict[str, Any]], metric: str | None = None
) -> tuple[bool | None, str]:
    """``holds`` over the census variants: ``unchanged`` must hold in every measured one; a change must show in at
    least one and go the other way in none (a patch may act only on the models whose code it changes)."""
    measured = [v for v in per_variant if v["holds"] is not None]
    if not measured:
        return None, "not measured in any census variant"
    if direction == "unchanged":
        bad = [v["variant"] for v in measured if not v["holds"]]
        return (not bad), ("unchanged in every variant" if not bad else f"changes in {', '.join(bad)}")
    good = [v["variant"] for v in measured if v["holds"]]
    wrong = [v["variant"] for v in measured if _against(direction, v["before"], v["after"], metric)]
    if wrong:
        return False, f"moves against the declaration in {', '.join(wrong)}"
    if not good:
        return False, f"no change in any variant ({', '.join(v['variant'] for v in measured)})"
    return True, f"{direction} in {', '.join(good)}"


def record_for(
    patch: Patch,
    mech: Mechanism,
    *,
    census: Census,
    stock: Arm,
    patched: Arm,
    scenarios: Sequence[str],
    index: int | None = None,
    prefix_arm: PrefixArm | None = None,
    cpu_label: Label | None = None,
) -> dict[str, Any]:
    """``index``: the patch's 1-based position in the series (needed, with ``prefix_arm``, for an always-on patch)."""
    switch = switch_for(patch.flags)
    rec: dict[str, Any] = {
        "patch": patch.name,
        "metric": mech.metric,
        "direction": mech.direction,
        "scenario": mech.scenario,
        "declared": mech.text,
        "flag": switch.text,
        "stock": None,
        "patched": None,
        "flag_off": None,
        "holds": None,
        "sites": {"stock": [], "patched": []},
        "note": None,
    }
    if mech.scenario not in scenarios:
        rec["note"] = (
            f"not measured: this engine's census has no scenario {mech.scenario!r} here "
            f"(it runs: {', '.join(scenarios) or 'none'})"
        )
        return rec
    if not switch.default:
        baseline = "flag off -> on (the whole series)"
    elif index is not None and prefix_arm is not None:
        baseline = (
            f"series prefix without -> with it ({prefix_arm(index - 1).name} -> {prefix_arm(index).name})"
        )
    else:
        baseline = "stock -> patched (the whole series)"
    rows: list[dict[str, Any]] = []
    results: list[tuple[dict[str, Any], ...]] = []
    for variant in (v for v in census.variants if v.applies(mech.scenario)):
        s = census.measure(stock, mech.scenario, None, variant)
        p = census.measure(patched, mech.scenario, switch, variant)
        off = census.measure(patched, mech.scenario, None, variant) if not switch.default else None
        if off is not None:
            pair = (off, p)
        elif index is not None and prefix_arm is not None:
            pair = (
                census.measure(prefix_arm(index - 1), mech.scenario, None, variant),
                census.measure(prefix_arm(index), mech.scenario, None, variant),
            )
        else:
            pair = (s, p)
        row: dict[str, Any] = {
            "variant": variant.name,
            "stock": None,
            "patched": None,
            "flag_off": None,
            "before": None,
            "after": None,
            "holds": None,
        }
        # only the judged pair must run; stock or the whole series failing (e.g. a path stock lacks) is noted
        errors = [
            f"{name}: {r['error']}" for name, r in (("before", pair[0]), ("after", pair[1])) if r.get("error")
        ]
        others = [
            f"{name} cannot run it ({r['error']})"
            for name, r in (("stock", s), ("patched", p))
            if r.get("error") and not any(r is q for q in pair)
        ]
        if errors:
            row["note"] = "not measured: the census task failed (" + "; ".join(dict.fromkeys(errors)) + ")"
        else:
            row.update(
                stock=_value(s, mech.metric),
                patched=_value(p, mech.metric),
                flag_off=_value(off, mech.metric) if off is not None else None,
                before=_value(pair[0], mech.metric),
                after=_value(pair[1], mech.metric),
            )
            row["holds"], why = decide(mech.metric, mech.direction, row["before"], row["after"])
            row["note"] = "; ".join([why if row["holds"] is not None else f"not measured: {why}", *others])
            if cpu_label is not None and row["holds"] is not None:
                label = cpu_label(mech, pair[0], pair[1])
                if label:
                    row["label"] = label
        rows.append(row)
        results.append((s, p, pair[0], pair[1]))
    holds, why = aggregate(mech.direction, rows, mech.metric)
    rec["holds"] = holds
    rec["baseline"] = baseline
    rec["variants"] = rows
    # the headline numbers: the first variant where the patch moves the metric, else the first measured one
    pick = next(
        (i for i, r in enumerate(rows) if r["holds"] is not None and r["before"] != r["after"]),
        next((i for i, r in enumerate(rows) if r["holds"] is not None), 0),
    )
    if not rows:
        rec["note"] = f"not measured: no census variant runs {mech.scenario!r}"
        return rec
    r, (s, p, b, a) = rows[pick], results[pick]
    for k in ("stock", "patched", "flag_off", "before", "after"):
        rec[k] = r[k]
    rec["variant"] = r["variant"]
    rec["sites"] = {
        "stock": (s.get("sites") or {}).get(mech.metric, []),
        "patched": (p.get("sites") or {}).get(mech.metric, []),
        "before": (b.get("sites") or {}).get(mech.metric, []),
        "after": (a.get("sites") or {}).get(mech.metric, []),
    }
    rec["detail"] = {
        "stock": s.get("detail"),
        "patched": p.get("detail"),
        "before": b.get("detail"),
        "after": a.get("detail"),
    }
    if r["flag_off"] is not None and _is_number(r["flag_off"]) and _is_number(r["stock"]):
        rec["gated"] = abs(float(r["flag_off"]) - float(r["stock"])) <= tolerance(
            mech.metric, float(r["stock"])
        )
    notes = [f"{baseline}: {why}" if holds is not None else f"not measured: {why}"]
    notes += [f"{row['variant']}: {row['note']}" for row in rows if row.get("note")]
    if r.get("label"):
        rec["cpu_only"] = str(r["label"]).startswith("CPU-only")
        notes.append(str(r["label"]))
    for res, name in ((s, "stock"), (p, "patched")):
        if res.get("standin"):
            notes.append(f"{name} arm: stand-in {res['standin']}")
    rec["note"] = "; ".join(notes)
    return rec


def census_records(
    *,
    patches: Sequence[Patch],
    census: Census,
    stock: Arm,
    patched: Arm,
    scenarios: Sequence[str],
    only: str | None = None,
    prefix_arm: PrefixArm | None = None,
    cpu_label: Label | None = None,
    unavailable: str | None = None,
) -> list[dict[str, Any]]:
    """One record per declared mechanism of every patch of the series ``patches`` (or of the patch named ``only``)."""
    records: list[dict[str, Any]] = []
    for index, patch in enumerate(patches, start=1):
        if only is not None and patch.name != only:
            continue
        for mech in patch.mechanisms:
            if unavailable is not None:
                records.append(
                    {
                        "patch": patch.name,
                        "metric": mech.metric,
                        "direction": mech.direction,
                        "scenario": mech.scenario,
                        "declared": mech.text,
                        "flag": switch_for(patch.flags).text,
                        "stock": None,
                        "patched": None,
                        "flag_off": None,
                        "holds": None,
                        "sites": {"stock": [], "patched": []},
                        "note": f"not measured: {unavailable}",
                    }
                )
                continue
            records.append(
                record_for(
                    patch,
                    mech,
                    census=census,
                    stock=stock,
                    patched=patched,
                    scenarios=scenarios,
                    index=index,
                    prefix_arm=prefix_arm,
                    cpu_label=cpu_label,
                )
            )
    return records


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
                    "detail": f"stock {_fmt(r['stock'])}, patched {_fmt(r['patched'])} (flag {r['flag']}); "
                    f"{r['note']}",
                }
            )
    return out


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if _is_number(x) else str(x)


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
        f"stock {_fmt(record['stock'])} patched {_fmt(record['patched'])}"
        + (f"  ({record['note']})" if record.get("note") else "")
    )
