"""`overlay check ENGINE`: the patched engine against the stock one, side by side, with numbers (orchestration only).

Arms: stock (the pinned artifact, or --stock-wheel) and patched (our wheel, or --patched-wheel), each pip-installed in
its own cached venv (overlay.check.envs) and driven in fresh subprocesses; a second stock arm run ("stock-b", fresh
processes of the same venv) gives the noise floor. The patched arm runs with the flags --flags chose
(overlay.check.flags); the gate class is the weakest class of the patches those flags make active. Speed repetitions
are interleaved (stock, patched, stock-b, then rotated), after a warm-up inside each process; their ratios carry a
paired log-ratio interval and a verdict (overlay.check.measures). The mechanism census (overlay.check.census) gates
the full check by default. The report is written (atomically) before a failing gate raises CheckFailed (exit 4).

Modules: options (CheckOptions), flags, inputs (prompts, corpus), artifacts (given wheels), measures, sampling
(temperature > 0), steps (census, speculation, per-patch), gates (gates, verdict, files), host (machine facts).
"""

from __future__ import annotations

import dataclasses
import difflib
import time
from pathlib import Path
from typing import Any, cast

from overlay.check import sampling
from overlay.check.adapter import EngineAdapter, Models
from overlay.check.artifacts import given_wheel, patches_of
from overlay.check.envs import Arm, arm_env
from overlay.check.flags import FlagChoice, choose
from overlay.check.gates import check_speed_gate, finish, gates_for, speed_gate
from overlay.check.host import backend_versions, host_facts, requirement_names
from overlay.check.inputs import PromptSpec, load_corpus, load_prompts, prompt_set, teacher_sequences
from overlay.check.measures import compare_greedy, logit_agreement, speed_block, speed_runs
from overlay.check.options import CLASS_ORDER, REPORT_VERSION, CheckOptions, series_class
from overlay.check.steps import mechanism_step, per_patch, spec_protocol
from overlay.check.surface import compare, wheel_surface
from overlay.core.archive_policy import MemberPolicy
from overlay.core.build import apply_engine
from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import Manifest, load_engine
from overlay.core.series import Patch, load_engine_series
from overlay.core.wheels import read_wheel
from overlay.errors import UsageError
from overlay.fsutil import owned_scratch
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
    reporter: Reporter,
) -> tuple[Path, Path, str, tuple[Patch, ...], list[str]]:
    """Stock wheel, patched wheel, series sha, the series patches the patched wheel holds, extra classes."""
    if options.stock_wheel is not None:
        stock_wheel = given_wheel(options.stock_wheel, manifest, option="--stock-wheel", patched=False).path
        report_notes.append(f"stock arm: the given wheel {stock_wheel.name} (not the pinned artifact)")
    else:
        stock_wheel = fetch_artifact(root, manifest, manifest.upstream.primary, reporter=reporter)
    if options.patched_wheel is None:
        build = apply_engine(root=root, engine=options.engine, reporter=reporter)
        return stock_wheel, build.wheel, build.provenance["series"]["sha256"], patches, []
    given = given_wheel(options.patched_wheel, manifest, option="--patched-wheel", patched=True)
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
    stock_wheel, patched_wheel, series_sha, held, extra_classes = _wheels(
        root, manifest, series.patches, options, notes, reporter
    )
    if len(held) != len(series.patches):
        flags = dataclasses.replace(
            flags,
            active=tuple(p for p in flags.active if p in held),
            inactive=tuple(p for p in flags.inactive if p in held),
        )
    adapter = _FlaggedAdapter(adapter, flags.options, {"patched"})
    stock = arm_env(root, manifest, stock_wheel, name="stock", reporter=reporter)
    plain = arm_env(root, manifest, patched_wheel, name="patched", reporter=reporter)
    # the census sets each patch's own flags on the plain arm (its flag-off baseline must stay off)
    patched = dataclasses.replace(plain, env={**plain.env, **flags.env})
    stock_b = dataclasses.replace(stock, name="stock-b")
    active_class = _active_class(flags, extra_classes)
    host["versions"] = {
        "stock": backend_versions(
            stock, [manifest.distribution, *requirement_names(manifest.runtime.requirements)]
        ),
        "patched": backend_versions(patched, [manifest.distribution]),
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
    }
    cli_only = [p for p in flags.active if p not in flags.exercised]
    if cli_only:
        notes.append(
            f"{len(cli_only)} patch(es) turned on by a CLI option only reach the census, not the output and "
            "speed comparisons: " + ", ".join(p.name.split("-", 1)[0] for p in cli_only)
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
        report["surface"] = compare(_surface(stock_wheel, manifest), _surface(patched_wheel, manifest))
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
        return finish(root, options, manifest, report, gates)

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
        return finish(root, options, manifest, report, gates)
    _engine_checks(
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
    return finish(root, options, manifest, report, gates)


def _active_class(flags: FlagChoice, extra: list[str]) -> str:
    classes = [series_class(flags.exercised), *extra]
    return max(classes, key=lambda c: CLASS_ORDER.get(c, 2))


def _engine_checks(
    report: dict[str, Any],
    gates: list[dict[str, Any]],
    *,
    root: Path,
    manifest: Manifest,
    adapter: EngineAdapter,
    arms: tuple[Arm, Arm, Arm],
    models: Models,
    options: CheckOptions,
    flags: FlagChoice,
    active_class: str,
    specs: list[PromptSpec] | None,
    docs: list[str] | None,
    reporter: Reporter,
) -> None:
    stock, patched, _stock_b = arms
    tasks = adapter.tasks()
    notes: list[str] = report["notes"]
    with owned_scratch(layout(root).tmp, f"check-{manifest.name}") as tmp:
        prompts, prompt_ids, source = prompt_set(adapter, stock, models, specs)
        report["inputs"]["prompt_set"] = source
        runs: dict[str, dict[str, Any]] = {}
        noise_greedy = None
        report["greedy"] = None
        if "greedy" in tasks:
            reporter.step("check", f"greedy: {len(prompts)} prompts x {options.max_tokens} tokens, 3 arms")
            for arm in arms:
                (tmp / f"g-{arm.name}").mkdir()
                runs[arm.name] = adapter.run(
                    arm,
                    {
                        "task": "greedy",
                        "model": str(models.target),
                        "prompts": prompt_ids,
                        "max_tokens": options.max_tokens,
                        "out": str(tmp / f"g-{arm.name}"),
                    },
                )
            report["greedy"] = compare_greedy(runs["stock"], runs["patched"], prompts)
            report["greedy"]["max_tokens"] = options.max_tokens
            noise_greedy = compare_greedy(runs["stock"], runs["stock-b"], prompts)
        logits = noise_logits = None
        if "logits" in tasks:
            positions = options.positions
            cap = getattr(adapter, "max_positions", None)
            if cap is not None and positions > cap:
                notes.append(
                    f"teacher-forced positions capped at {cap} for {manifest.name} (the engine returns "
                    "full-vocabulary logprobs through its API, which is slow on CPU)"
                )
                positions = cap
            seqs = teacher_sequences(
                adapter, stock, models, positions=positions, seq_len=options.seq_len, docs=docs
            )
            reporter.step(
                "check", f"logits: teacher-forced, {sum(len(s) - 1 for s in seqs)} positions, 3 arms"
            )
            files: dict[str, list[str]] = {}
            for arm in arms:
                (tmp / f"l-{arm.name}").mkdir()
                files[arm.name] = adapter.run(
                    arm,
                    {
                        "task": "logits",
                        "model": str(models.target),
                        "sequences": seqs,
                        "vocab_size": prompts[0].get("vocab_size"),
                        "out": str(tmp / f"l-{arm.name}"),
                    },
                )["files"]
            logits = logit_agreement(files["stock"], files["patched"], seqs)
            noise_logits = logit_agreement(files["stock"], files["stock-b"], seqs)
            for arm_files in files.values():
                for f in arm_files:
                    Path(f).unlink(missing_ok=True)
        report["logits"] = logits
        spec = None
        if "spec" in tasks and models.draft is not None:
            spec = spec_protocol(adapter, stock, patched, models, prompt_ids, runs, options, tmp, reporter)
        report["speculative"] = spec
        if spec and "real" in spec:
            spec["acceptance_length"] = spec["real"]["patched"]["acceptance_length"]
            spec["acceptance_rate"] = spec["real"]["patched"]["acceptance_rate"]
        report["sampling"] = _sampling(
            report,
            gates,
            manifest=manifest,
            stock=stock,
            patched=patched,
            models=models,
            prompt_ids=prompt_ids,
            prompts=prompts,
            options=options,
            flags=flags,
            active_class=active_class,
            reporter=reporter,
        )
        speed = noise_speed = None
        if "speed" in tasks:
            reporter.step(
                "check",
                f"speed: {options.reps} interleaved repetitions x 3 arms (warm-up inside each process)",
            )
            samples = speed_runs(
                adapter,
                list(arms),
                models,
                prompt_ids[0] * 4,
                reps=options.reps,
                decode_tokens=options.decode_tokens,
                reporter=reporter,
                cold="cold" in tasks,
            )
            speed = speed_block(samples, "patched", "stock")
            noise_speed = speed_block(samples, "stock-b", "stock")["ratio"]
            if options.reps < 5:
                notes.append(
                    f"speed: {options.reps} repetition(s); intervals from fewer than 5 paired repetitions are "
                    "wide, and with 1 there is none (every speed verdict reads inconclusive)"
                )
        report["speed"] = speed
        report["noise_floor"] = {"greedy": noise_greedy, "logits": noise_logits, "speed_ratio": noise_speed}
        gates += gates_for(
            active_class, greedy=report["greedy"], logits=logits, spec=spec, manifest=manifest, who="series"
        )
        if options.min_speedup is not None and speed is not None:
            gates.append(speed_gate(speed["ratio"]["decode"], options.min_speedup))
        if options.per_patch:
            report["per_patch"] = per_patch(
                root,
                manifest,
                adapter,
                stock,
                models,
                prompts,
                prompt_ids,
                options,
                tmp,
                reporter,
                gates,
                flag_env=flags.env,
                active={p.name for p in flags.active},
                docs=docs,
            )


def _sampling(
    report: dict[str, Any],
    gates: list[dict[str, Any]],
    *,
    manifest: Manifest,
    stock: Arm,
    patched: Arm,
    models: Models,
    prompt_ids: list[list[int]],
    prompts: list[dict[str, Any]],
    options: CheckOptions,
    flags: FlagChoice,
    active_class: str,
    reporter: Reporter,
) -> dict[str, Any] | None:
    if options.temperature <= 0:
        return None
    if not sampling.available(manifest.name):
        report["notes"].append(
            f"--temperature {options.temperature:g}: no sampling worker for {manifest.name}; the "
            "distribution check did not run"
        )
        return None
    n = min(sampling.SAMPLE_PROMPTS, len(prompt_ids))
    seeds = list(range(1, options.samples + 1))
    reporter.step(
        "check",
        f"sampling at T={options.temperature:g}: {n} prompts x {len(seeds)} seeds x "
        f"{options.sample_positions} positions, 2 arms",
    )
    out = {}
    for arm in (stock, patched):
        out[arm.name] = sampling.sample(
            manifest.name,
            arm,
            models.target,
            prompt_ids[:n],
            temperature=options.temperature,
            seeds=seeds,
            positions=options.sample_positions,
            options=flags.options if arm.name == "patched" else None,
        )
    result = sampling.compare(
        out["stock"],
        out["patched"],
        categories=[p["category"] for p in prompts[:n]],
        temperature=options.temperature,
        positions=options.sample_positions,
    )
    if active_class in ("exact", "lossless"):
        gates.append(sampling.gate(result, active_class))
    else:
        result["gated"] = False
        report["notes"].append(
            f"sampling at T={options.temperature:g}: reported, not gated (the active patches are "
            f"{active_class}: their distribution may differ)"
        )
    return result


def _wheel_of(arm: Arm) -> dict[str, str]:
    return {"wheel": arm.wheel.name, "version": arm.version}


def _surface(wheel: Path, manifest: Manifest) -> dict[str, Any]:
    contents = read_wheel(wheel, policy=MemberPolicy.of(manifest.upstream.allow_members))
    return wheel_surface(contents.tree, contents.dist_info)
