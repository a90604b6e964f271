"""The mechanism census of `overlay check`: does each patch change what its ``Overlay-Mechanism`` trailers say?

For every declared mechanism (``METRIC DIRECTION in SCENARIO``) the engine adapter's ``census`` task runs in the
stock arm, in the patched arm (the whole series) with the patch's ``Overlay-Flag`` on and, for an opt-in patch, with
it off; same scenario, same inputs, each configuration once (cached per arm, scenario, environment and options).

The patch's own effect is what is judged, never another patch of the series: ``holds`` compares ``before`` with
``after``, where for an opt-in patch (an env or CLI flag) before/after are the patched arm with the flag off/on, and for
an always-on patch (``Overlay-Flag: default``) they are the series prefixes without and with it (``overlay apply
--upto``; the prefix without patch 1 is stock). overlay.check.census_rules decides whether it holds (the direction,
the tolerances); overlay.check.census_report turns the records into counts, gates and lines.

A scenario the engine cannot run here, a metric its census does not count, or a census task that fails gives
``holds: None`` with the reason: "not measured", never counted as holding. Pure: no printing; the caller reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from overlay.check.census_rules import aggregate, decide, is_number, tolerance
from overlay.check.envs import Arm
from overlay.core.mechanism import Flag, Mechanism
from overlay.core.series import Patch
from overlay.errors import OverlayError
from overlay.schemas.documents import CensusRequest, WorkerRequest

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
            run_arm = arm.with_env(env)
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


def declared(patch: Patch, mech: Mechanism, switch: Switch) -> dict[str, Any]:
    """What every census record says of one declared mechanism: the patch, the claim and the switch turning it on."""
    return {
        "patch": patch.name,
        "metric": mech.metric,
        "direction": mech.direction,
        "scenario": mech.scenario,
        "declared": mech.text,
        "flag": switch.text,
    }


Label = Callable[[Mechanism, dict[str, Any], dict[str, Any]], str | None]
PrefixArm = Callable[[int], Arm]  # the arm of the series' first N patches (0: stock)


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
        **declared(patch, mech, switch),
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
    if r["flag_off"] is not None and is_number(r["flag_off"]) and is_number(r["stock"]):
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
                        **declared(patch, mech, switch_for(patch.flags)),
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
