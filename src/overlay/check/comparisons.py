"""The engine path of `overlay check ENGINE` after the census: the comparisons of the patched arm with stock, each
with the stock-b arm as its noise floor (overlay.check.run orchestrates; overlay.check.measures computes).

Greedy outputs (3 arms), teacher-forced logits (3 arms, capped where the engine's API is slow), speculative decoding
(self, never-right and real drafts; overlay.check.steps), sampling at temperature > 0 (2 arms; overlay.check.sampling),
interleaved speed repetitions (3 arms), the series' gates, and with --per-patch each patch against the prefix before
it. Results go into the report and gates passed in; nothing is printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlay.check import sampling
from overlay.check.adapter import EngineAdapter, Models
from overlay.check.envs import Arm
from overlay.check.flags import FlagChoice
from overlay.check.gates import gates_for, speed_gate
from overlay.check.inputs import PromptSpec, prompt_set, teacher_sequences
from overlay.check.measures import compare_greedy, logit_agreement, speed_block, speed_runs
from overlay.check.options import CheckOptions
from overlay.check.steps import per_patch, spec_protocol
from overlay.core.manifest import Manifest
from overlay.fsutil import owned_scratch
from overlay.paths import layout
from overlay.progress import Reporter


def engine_checks(
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
        drafted = next(
            (
                label
                for label in ("real", "mtp")
                if spec and label in spec and "error" not in spec[label]["patched"]
            ),
            None,
        )
        if spec and drafted:
            spec["acceptance_length"] = spec[drafted]["patched"]["acceptance_length"]
            spec["acceptance_rate"] = spec[drafted]["patched"]["acceptance_rate"]
            notes += [f"speculative {drafted}: {note}" for note in spec[drafted].get("notes", [])]
        for label, entry in (spec or {}).items():
            if isinstance(entry, dict) and "error" in (entry.get("stock") or {}):
                notes.append(
                    f"speculative {label}: the stock arm cannot run it ({entry['stock']['error'][-200:]})"
                    + ("" if "error" in entry["patched"] else "; the patched arm runs it")
                )
        report["sampling"] = sampling_step(
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
                wheel_log=report.setdefault("wheel_cache", []),
            )


def sampling_step(
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
        seeded=sampling.SEEDED_PER_RUN.get(manifest.name, True),
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
