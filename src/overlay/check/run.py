"""`overlay check ENGINE`: the patched engine against the stock one, side by side, with numbers.

Arms: stock (the pinned artifact) and patched (our wheel), each pip-installed in its own cached venv (overlay.check.envs)
and driven in fresh subprocesses; a second stock arm run ("stock-b", fresh processes of the same venv) gives the noise
floor. Speed repetitions are interleaved (stock, patched, stock-b, then rotated), after a warm-up inside each process.
The mechanism census (overlay.check.census) counts, per declared ``Overlay-Mechanism``, stock vs patched in the
engine's real call path; ``mechanism=True`` runs it alone. The report is written (atomically) before a failing gate
raises CheckFailed (exit 4).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from overlay.check import census as census_mod
from overlay.check import stats
from overlay.check.adapter import EngineAdapter, Models
from overlay.check.envs import Arm, arm_env
from overlay.check.surface import compare, wheel_surface
from overlay.core.archive_policy import MemberPolicy
from overlay.core.build import apply_engine
from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import Manifest, load_engine
from overlay.core.series import Patch, load_engine_series
from overlay.core.wheels import read_wheel
from overlay.errors import CheckFailed, UsageError
from overlay.fsutil import atomic_write_json, atomic_write_text, owned_scratch
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter

REPORT_VERSION = 1
CLASS_ORDER = {"exact": 0, "lossless": 1, "approximate": 2}


@dataclass(frozen=True)
class CheckOptions:
    engine: str
    model: Path | None = None
    draft: Path | None = None
    per_patch: bool = False
    reps: int = 5
    positions: int = 50_000
    seq_len: int = 256
    max_tokens: int = 48
    num_draft: int = 3
    decode_tokens: int = 128
    json_path: Path | None = None
    html_path: Path | None = None
    min_speedup: float | None = None
    allow_few_positions: bool = False
    target_kind: str | None = None
    draft_kind: str | None = None
    mechanism: bool = False  # run the mechanism census alone
    # a declared mechanism that does not hold fails the check; None: with `mechanism` only (the full check reports it)
    gate_mechanism: bool | None = None
    patch: str | None = None  # census only this patch's mechanisms
    census_steps: int = census_mod.DEFAULT_STEPS


def reports_dir(root: Path) -> Path:
    return layout(root).reports


def series_class(patches: Sequence[Patch]) -> str:
    """The weakest numerics class of a set of patches (exact < lossless < approximate)."""
    classes = [p.numerics or "approximate" for p in patches]
    return max(classes, key=lambda c: CLASS_ORDER.get(c, 2)) if classes else "exact"


# ------------------------------------------------------------------ inputs


def prompt_set(adapter: EngineAdapter, arm: Arm, models: Models) -> tuple[list[dict[str, Any]], list[list[int]]]:
    from overlay.check import models as tinymodels

    prompts: list[dict[str, Any]] = [{"category": c, "text": t} for c, t in tinymodels.all_prompts()]
    res = adapter.run(arm, {"task": "tokenize", "model": str(models.target), "prompts": [p["text"] for p in prompts]})
    for p, ids in zip(prompts, res["ids"]):
        p["vocab_size"] = res.get("vocab_size")
    return prompts, res["ids"]


def teacher_sequences(adapter: EngineAdapter, arm: Arm, models: Models, *, positions: int, seq_len: int) -> list[list[int]]:
    """Token sequences from the built-in corpus (a held-out seed), enough for ``positions`` scored positions."""
    from overlay.check.models import corpus

    docs = corpus.documents(max(64, positions // 40), seed=7_777)
    ids = adapter.run(arm, {"task": "tokenize", "model": str(models.target), "prompts": docs})["ids"]
    stream = [t for doc in ids for t in doc]
    seqs: list[list[int]] = []
    need = positions
    pos = 0
    while need > 0:
        if pos + seq_len + 1 > len(stream):
            pos = 0
            if not stream or len(stream) < seq_len + 1:
                raise UsageError("the built-in corpus is too short for --seq-len")
            stream = stream[1:] + stream[:1]  # shift so repeated passes score different windows
        seqs.append(stream[pos : pos + seq_len + 1])
        pos += seq_len + 1
        need -= seq_len
    return seqs


def never_right_draft(target: Path, out: Path) -> Path:
    """A copy of ``target`` whose output head is rolled by one row: its argmax is always the target's + 1 (mod V), so
    every first draft token is wrong. Exercises rejection and rollback; outputs must stay identical."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in target.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy2(f, out / f.name)
    config = json.loads((target / "config.json").read_text())
    files = sorted(target.glob("*.safetensors"))
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    head = next((k for k in tensors if k.endswith("lm_head.weight")), None)
    if head is None:
        embed = next(k for k in tensors if k.endswith("embed_tokens.weight"))
        head = embed.replace("model.embed_tokens.weight", "lm_head.weight").replace("embed_tokens.weight", "lm_head.weight")
        tensors[head] = tensors[embed].copy()
        config["tie_word_embeddings"] = False
        (out / "config.json").write_text(json.dumps(config, indent=2))
    tensors[head] = np.roll(tensors[head], 1, axis=0)
    for old in out.glob("*.safetensors*"):
        old.unlink()
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    return out


# ------------------------------------------------------------------ measures


def compare_greedy(ref: dict[str, Any], cand: dict[str, Any], prompts: list[dict[str, Any]]) -> dict[str, Any]:
    identical = 0
    first: dict[str, Any] | None = None
    max_diff = 0.0
    bit_identical = True
    for i, (a, b) in enumerate(zip(ref["outputs"], cand["outputs"])):
        if a == b:
            identical += 1
        elif first is None:
            t = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y) if any(x != y for x, y in zip(a, b)) else min(len(a), len(b))
            first = {
                "prompt": i,
                "category": prompts[i]["category"],
                "position": t,
                "stock_token": a[t] if t < len(a) else None,
                "patched_token": b[t] if t < len(b) else None,
                "logit_margin": ref["margins"][i][t] if t < len(ref["margins"][i]) else None,
                "patched_margin": cand["margins"][i][t] if t < len(cand["margins"][i]) else None,
            }
        if ref.get("files") and cand.get("files"):
            la, lb = np.load(ref["files"][i]), np.load(cand["files"][i])
            n = min(len(la), len(lb), next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) + 1)
            if la[:n].shape == lb[:n].shape:
                bit_identical &= bool(np.array_equal(la[:n], lb[:n]))
                if n:
                    max_diff = max(max_diff, float(np.max(np.abs(la[:n] - lb[:n]))))
    return {
        "prompts": len(ref["outputs"]),
        "identical_count": identical,
        "identical": identical == len(ref["outputs"]),
        "first_divergence": first,
        "logprobs_bit_identical": bit_identical,
        "logprobs_max_abs_diff": max_diff,
    }


def logit_agreement(ref_files: list[str], cand_files: list[str], seqs: list[list[int]]) -> dict[str, Any]:
    out = []
    for rf, cf, seq in zip(ref_files, cand_files, seqs):
        out.append(stats.agreement(np.load(rf), np.load(cf), np.asarray(seq[1:])))
    return stats.summarize(out)


def _acceptance(accepted: int, drafted: int, cycles: int) -> dict[str, Any]:
    return {
        "accepted": accepted,
        "drafted": drafted,
        "cycles": cycles,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_length": (accepted + cycles) / cycles if cycles else 0.0,
    }


def spec_summary(run: dict[str, Any], k: int, *, engine_counters: bool = True) -> dict[str, Any]:
    """Acceptance from one spec run: the engine's exact counters when it reports them for every prompt (patched
    mlx-lm does) and ``engine_counters`` is set, else derived from the per-token ``from_draft`` flags (every verify
    cycle emits its accepted drafts then one target token; an estimate: the last cycle may draft fewer). Engine
    counters, when present, are also kept under ``engine``."""
    flag_a = flag_c = 0
    eng = [0, 0, 0]
    exact = True
    for r in run["results"]:
        flags = r["from_draft"]
        flag_a += sum(flags)
        flag_c += len(flags) - sum(flags)
        s = r.get("stats")
        if s and {"accepted", "drafted", "cycles"} <= set(s):
            eng = [eng[0] + int(s["accepted"]), eng[1] + int(s["drafted"]), eng[2] + int(s["cycles"])]
        else:
            exact = False
    engine = _acceptance(*eng) if exact and run["results"] else None
    if engine is not None and engine_counters:
        return {**engine, "counters": "engine", "engine": engine}
    out = {**_acceptance(flag_a, flag_c * k, flag_c),
           "counters": "derived from from_draft flags (an estimate: the last cycle may draft fewer)"}
    if engine is not None:
        out["engine"] = engine
    return out


def speed_runs(adapter: EngineAdapter, arms: Sequence[Arm], models: Models, prompt: list[int], *, reps: int,
               decode_tokens: int, reporter: Reporter, cold: bool) -> dict[str, dict[str, list[float]]]:
    samples: dict[str, dict[str, list[float]]] = {
        a.name: {"decode_tok_s": [], "decode_cpu_tok_s": [], "prefill_tok_s": [], "cold_start_s": []} for a in arms}
    for rep in range(reps):
        order = list(arms[rep % len(arms):]) + list(arms[: rep % len(arms)])
        for arm in order:
            res = adapter.run(arm, {"task": "speed", "model": str(models.target), "prompt": prompt,
                                    "decode_tokens": decode_tokens})
            samples[arm.name]["decode_tok_s"].append(res["decode_tok_s"])
            samples[arm.name]["prefill_tok_s"].append(res["prefill_tok_s"])
            if "decode_cpu_tok_s" in res:
                samples[arm.name]["decode_cpu_tok_s"].append(res["decode_cpu_tok_s"])
            if cold:
                t0 = time.time()
                c = adapter.run(arm, {"task": "cold", "model": str(models.target), "prompt": prompt[:16]})
                samples[arm.name]["cold_start_s"].append(c["t_first_token"] - t0)
        reporter.step("check", f"speed: repetition {rep + 1}/{reps} done")
    return samples


def speed_block(samples: dict[str, dict[str, list[float]]], cand: str, ref: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in (ref, cand):
        out[name] = {k: stats.spread(v) for k, v in samples[name].items() if v}
    out["ratio"] = {
        "decode": stats.ratio_ci(samples[cand]["decode_tok_s"], samples[ref]["decode_tok_s"]),
        "prefill": stats.ratio_ci(samples[cand]["prefill_tok_s"], samples[ref]["prefill_tok_s"]),
    }
    if samples[cand]["decode_cpu_tok_s"]:
        out["ratio"]["decode_cpu"] = stats.ratio_ci(samples[cand]["decode_cpu_tok_s"], samples[ref]["decode_cpu_tok_s"])
    if samples[cand]["cold_start_s"]:
        out["ratio"]["cold_start"] = stats.ratio_ci(samples[cand]["cold_start_s"], samples[ref]["cold_start_s"])
    return out


# ------------------------------------------------------------------ gates


def gates_for(cls: str, *, greedy: dict[str, Any] | None, logits: dict[str, Any] | None,
              spec: dict[str, Any] | None, manifest: Manifest, who: str) -> list[dict[str, Any]]:
    gates: list[dict[str, Any]] = []

    def gate(name: str, passed: bool, detail: str) -> None:
        gates.append({"subject": who, "class": cls, "gate": name, "passed": bool(passed), "detail": detail})

    if cls == "exact":
        if logits is not None and logits.get("positions"):
            gate("logits bit-identical", logits["bit_identical"],
                 f"max |d logprob| = {logits['max_abs_diff']:.3g} over {logits['positions']} positions")
        if greedy is not None:
            gate("greedy identical", greedy["identical"], f"{greedy['identical_count']}/{greedy['prompts']} prompts")
            gate("greedy logprobs bit-identical", greedy["logprobs_bit_identical"],
                 f"max |d| = {greedy['logprobs_max_abs_diff']:.3g}")
    elif cls == "lossless":
        if greedy is not None:
            gate("greedy identical", greedy["identical"], f"{greedy['identical_count']}/{greedy['prompts']} prompts")
        if spec is not None and "self" in spec:
            rate = spec["self"]["patched"].get("engine", spec["self"]["patched"])["acceptance_rate"]
            gate("self-draft acceptance >= 0.98", rate >= 0.98, f"rate {rate:.3f}")
    else:
        if logits is not None and logits.get("positions"):
            gate(f"KLD mean <= {manifest.check.kld_max:g}", logits["kld_mean"] <= manifest.check.kld_max,
                 f"{logits['kld_mean']:.3g} +/- {logits['kld_se']:.2g}")
            gate(f"top-1 >= {manifest.check.top1_min:g}", logits["top1_agreement"] >= manifest.check.top1_min,
                 f"{logits['top1_agreement']:.4f}")
    if spec is not None and "never" in spec:
        gate("never-right draft: output identical to serial", spec["never"]["patched_identical_to_serial"],
             f"acceptance {spec['never']['patched']['acceptance_rate']:.3f}")
    return gates


# ------------------------------------------------------------------ the check


def _wheel_of(arm: Arm) -> dict[str, str]:
    return {"wheel": arm.wheel.name, "version": arm.version}


def run_check(*, root: Path, options: CheckOptions, adapter: EngineAdapter, reporter: Reporter | None = None) -> dict[str, Any]:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, options.engine)
    series = load_engine_series(root, manifest)
    if options.positions < 50_000 and not options.allow_few_positions:
        raise UsageError(f"--positions {options.positions} is below 50000", tip="pass --allow-few-positions to accept fewer")
    if options.reps < 1:
        raise UsageError("--reps must be at least 1")
    if options.census_steps < 1:
        raise UsageError(f"--census-steps {options.census_steps} must be at least 1")
    if options.patch is not None and options.patch not in series.names:
        raise UsageError(f"--patch {options.patch!r} is not in the {manifest.name} series",
                         tip=f"patches: {', '.join(series.names)}")
    artifact = manifest.upstream.primary
    stock_wheel = fetch_artifact(root, manifest, artifact, reporter=reporter)
    patched_build = apply_engine(root=root, engine=options.engine, reporter=reporter)
    stock = arm_env(root, manifest, stock_wheel, name="stock", reporter=reporter)
    patched = arm_env(root, manifest, patched_build.wheel, name="patched", reporter=reporter)
    stock_b = Arm(name="stock-b", engine=stock.engine, venv=stock.venv, wheel=stock.wheel, version=stock.version, env=stock.env)
    patches = series.patches
    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "engine": manifest.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "arms": {"stock": _wheel_of(stock), "patched": _wheel_of(patched)},
        "series": {"sha256": patched_build.provenance["series"]["sha256"], "class": series_class(patches),
                   "patches": [{"name": p.name, "subject": p.subject, "numerics": p.numerics, "theme": p.theme}
                               for p in patches]},
        "notes": [],
    }
    gates: list[dict[str, Any]] = []
    if not options.mechanism:
        reporter.step("check", "static drop-in check: public surface of the patched wheel vs stock")
        report["surface"] = compare(_surface(stock_wheel, manifest), _surface(patched_build.wheel, manifest))
        gates.append({
            "subject": "series", "class": "surface", "gate": "public surface compatible",
            "passed": report["surface"]["compatible"],
            "detail": f"{len(report['surface']['removed'])} removed, {len(report['surface']['changed'])} changed",
        })
    why = adapter.unavailable(stock)
    if why is not None and options.mechanism:
        report["model"] = None
        report["mode"] = "mechanism"
        for key in ("greedy", "logits", "speculative", "speed", "noise_floor"):
            report[key] = None
        _mechanism(report, gates, root=root, adapter=adapter, stock=stock, patched=patched, patches=patches, models=None,
                   options=options, reporter=reporter)
        return _finish(root, options, manifest, report, gates)
    if why is not None:
        report["model"] = None
        report["mode"] = "fallback"
        report["notes"].append(f"{manifest.name} cannot run on this machine ({why}); ran the patch-level differential "
                               "tests instead (stock vs patched functions on the same inputs)")
        fb = adapter.fallback(root=root, reporter=reporter)
        report["fallback"] = fb
        gates.append({"subject": "series", "class": "patch tests", "gate": "patch-level differential tests pass",
                      "passed": bool(fb.get("passed")), "detail": fb.get("summary") or fb.get("reason", "")})
        for key in ("greedy", "logits", "speculative", "speed", "noise_floor"):
            report[key] = None
        _mechanism(report, gates, root=root, adapter=adapter, stock=stock, patched=patched, patches=patches, models=None,
                   options=options, reporter=reporter)
        return _finish(root, options, manifest, report, gates)

    report["mode"] = "mechanism" if options.mechanism else "engine"
    models = adapter.models(root=root, arm=stock, model=options.model, draft=options.draft, reporter=reporter,
                            target_kind=options.target_kind or manifest.check.default_model,
                            draft_kind=options.draft_kind)
    report["model"] = {"path": str(models.target), "kind": models.target_kind,
                       "draft": str(models.draft) if models.draft else None, "draft_kind": models.draft_kind}
    if options.mechanism:
        for key in ("greedy", "logits", "speculative", "speed", "noise_floor"):
            report[key] = None
        _mechanism(report, gates, root=root, adapter=adapter, stock=stock, patched=patched, patches=patches, models=models,
                   options=options, reporter=reporter)
        return _finish(root, options, manifest, report, gates)
    _mechanism(report, gates, root=root, adapter=adapter, stock=stock, patched=patched, patches=patches, models=models,
               options=options, reporter=reporter)
    tasks = adapter.tasks()
    with owned_scratch(layout(root).tmp, f"check-{manifest.name}") as tmp:
        prompts, prompt_ids = prompt_set(adapter, stock, models)
        runs: dict[str, dict[str, Any]] = {}
        if "greedy" in tasks:
            reporter.step("check", f"greedy: {len(prompts)} prompts x {options.max_tokens} tokens, 3 arms")
            for arm in (stock, patched, stock_b):
                (tmp / f"g-{arm.name}").mkdir()
                runs[arm.name] = adapter.run(arm, {"task": "greedy", "model": str(models.target), "prompts": prompt_ids,
                                                   "max_tokens": options.max_tokens, "out": str(tmp / f"g-{arm.name}")})
            report["greedy"] = compare_greedy(runs["stock"], runs["patched"], prompts)
            report["greedy"]["max_tokens"] = options.max_tokens
            noise_greedy = compare_greedy(runs["stock"], runs["stock-b"], prompts)
        else:
            report["greedy"], noise_greedy = None, None
        logits = noise_logits = None
        if "logits" in tasks:
            positions = options.positions
            cap = getattr(adapter, "max_positions", None)
            if cap is not None and positions > cap:
                report["notes"].append(f"teacher-forced positions capped at {cap} for {manifest.name} (the engine "
                                       "returns full-vocabulary logprobs through its API, which is slow on CPU)")
                positions = cap
            seqs = teacher_sequences(adapter, stock, models, positions=positions, seq_len=options.seq_len)
            reporter.step("check", f"logits: teacher-forced, {sum(len(s) - 1 for s in seqs)} positions, 3 arms")
            files: dict[str, list[str]] = {}
            for arm in (stock, patched, stock_b):
                (tmp / f"l-{arm.name}").mkdir()
                files[arm.name] = adapter.run(arm, {"task": "logits", "model": str(models.target), "sequences": seqs,
                                                    "vocab_size": prompts[0].get("vocab_size"),
                                                    "out": str(tmp / f"l-{arm.name}")})["files"]
            logits = logit_agreement(files["stock"], files["patched"], seqs)
            noise_logits = logit_agreement(files["stock"], files["stock-b"], seqs)
            for arm_files in files.values():
                for f in arm_files:
                    Path(f).unlink(missing_ok=True)
        report["logits"] = logits
        spec = None
        if "spec" in tasks and models.draft is not None:
            spec = _spec_protocol(adapter, stock, patched, models, prompt_ids, runs, options, tmp, reporter)
        report["speculative"] = spec
        if spec and "real" in spec:
            report["speculative"]["acceptance_length"] = spec["real"]["patched"]["acceptance_length"]
            report["speculative"]["acceptance_rate"] = spec["real"]["patched"]["acceptance_rate"]
        speed = None
        if "speed" in tasks:
            reporter.step("check", f"speed: {options.reps} interleaved repetitions x 3 arms (warm-up inside each process)")
            samples = speed_runs(adapter, [stock, patched, stock_b], models, prompt_ids[0] * 4, reps=options.reps,
                                 decode_tokens=options.decode_tokens, reporter=reporter, cold="cold" in tasks)
            speed = speed_block(samples, "patched", "stock")
            noise_speed = speed_block(samples, "stock-b", "stock")["ratio"]
        else:
            noise_speed = None
        report["speed"] = speed
        report["noise_floor"] = {"greedy": noise_greedy, "logits": noise_logits, "speed_ratio": noise_speed}
        cls = series_class(patches)
        gates += gates_for(cls, greedy=report["greedy"], logits=logits, spec=spec, manifest=manifest, who="series")
        if options.min_speedup is not None and speed is not None:
            low = speed["ratio"]["decode"]["ci_low"]
            gates.append({"subject": "series", "class": "speed", "gate": f"decode speedup CI low >= {options.min_speedup:g}",
                          "passed": low >= options.min_speedup, "detail": f"ratio {speed['ratio']['decode']['ratio']:.3f}, CI low {low:.3f}"})
        if options.per_patch:
            report["per_patch"] = _per_patch(root, manifest, adapter, stock, models, prompts, prompt_ids, options, tmp,
                                             reporter, gates)
    return _finish(root, options, manifest, report, gates)


def _mechanism(report: dict[str, Any], gates: list[dict[str, Any]], *, root: Path, adapter: EngineAdapter, stock: Arm,
               patched: Arm, patches: Sequence[Patch], models: Models | None, options: CheckOptions,
               reporter: Reporter, unavailable: str | None = None) -> None:
    """The mechanism census into ``report["mechanism"]`` (and its failed gates into ``gates``)."""
    scenarios = adapter.census_scenarios() if unavailable is None else ()
    # an engine that cannot run its full tasks here may still run its census (e.g. with labelled stand-ins)
    chosen = [p for p in patches if options.patch in (None, p.name)]
    declared = sum(len(p.mechanisms) for p in chosen)
    reporter.step("check", f"mechanism census: {declared} declared mechanism(s) in {len(chosen)} patch(es)"
                  + (f", scenarios {', '.join(scenarios)}" if scenarios else ""))
    pick = getattr(adapter, "census_variants", None)
    variants: tuple[census_mod.Variant, ...] = ()
    if scenarios and callable(pick):
        variants = tuple(pick(root=root, arm=stock, models=models, explicit=options.model is not None,
                              reporter=reporter))
    elif scenarios:  # the adapter's census picks its own model (or stand-in) when none is given
        variants = (census_mod.Variant(name=models.target_kind or models.target.name, model=str(models.target))
                    if models is not None else census_mod.Variant(name="the census's own model", model=""),)
    gate = options.mechanism if options.gate_mechanism is None else options.gate_mechanism
    census = census_mod.Census(lambda arm, req: adapter.run(arm, req, timeout=600), variants=variants,
                               steps=options.census_steps)
    prefixes: dict[int, Arm] = {0: stock, len(patches): patched}

    def prefix_arm(n: int) -> Arm:
        if n not in prefixes:
            manifest = load_engine(root, options.engine)
            build = apply_engine(root=root, engine=options.engine, upto=n, reporter=reporter)
            prefixes[n] = arm_env(root, manifest, build.wheel, name=f"upto-{n}", reporter=reporter)
        return prefixes[n]

    label = getattr(adapter, "census_label", None)
    cpu_label = (lambda m, s, p: label(m.metric, s, p)) if callable(label) else None
    records = census_mod.census_records(patches=patches, only=options.patch, census=census, stock=stock,
                                        patched=patched, scenarios=scenarios, prefix_arm=prefix_arm,
                                        cpu_label=cpu_label, unavailable=unavailable)
    report["mechanism"] = records
    counts = census_mod.summary(records)
    report["mechanism_summary"] = {**counts, "census_runs": census.runs, "steps": options.census_steps,
                                   "variants": [{"name": v.name, "model": v.model, **dict(v.extra)} for v in variants],
                                   "gated": gate, "tolerance": census_mod.TOLERANCE,
                                   "relative_tolerance": dict(census_mod.RELATIVE_TOLERANCE)}
    if counts["do_not_hold"]:
        report["notes"].append(
            f"mechanism: {counts['do_not_hold']} of {counts['declared']} declared do not hold"
            + ("" if gate else " (NOT GATED in this run: `overlay check "
               f"{report['engine']} --mechanism` or --gate-mechanism gates them; see the mechanism records)"))
    if counts["not_measured"]:
        report["notes"].append(f"mechanism: {counts['not_measured']} of {counts['declared']} declared not measured here")
    gates += census_mod.gates(records, enforce=gate)


def _surface(wheel: Path, manifest: Manifest) -> dict[str, Any]:
    contents = read_wheel(wheel, policy=MemberPolicy.of(manifest.upstream.allow_members))
    return wheel_surface(contents.tree, contents.dist_info)


def _spec_protocol(adapter: EngineAdapter, stock: Arm, patched: Arm, models: Models, prompt_ids: list[list[int]],
                   greedy_runs: dict[str, dict[str, Any]], options: CheckOptions, tmp: Path,
                   reporter: Reporter) -> dict[str, Any]:
    drafts = {"self": models.target, "never": never_right_draft(models.target, tmp / "never-draft")}
    if models.draft is not None:
        drafts["real"] = models.draft
    out: dict[str, Any] = {"k": options.num_draft, "max_tokens": options.max_tokens, "prompts": len(prompt_ids)}
    per_arm: dict[str, dict[str, Any]] = {}
    for arm in (stock, patched):
        reporter.step("check", f"speculative: {', '.join(drafts)} drafts, k={options.num_draft}, {arm.name} arm")
        per_arm[arm.name] = adapter.run(arm, {"task": "spec", "model": str(models.target),
                                              "drafts": {k: str(v) for k, v in drafts.items()}, "prompts": prompt_ids,
                                              "k": options.num_draft, "max_tokens": options.max_tokens})["drafts"]
    for label in drafts:
        entry: dict[str, Any] = {}
        # Like with like: engine counters only when both arms report them, else both from the from_draft flags.
        both = all(r.get("stats") for arm in (stock, patched) for r in per_arm[arm.name][label]["results"])
        for arm in (stock, patched):
            run = per_arm[arm.name][label]
            entry[arm.name] = spec_summary(run, options.num_draft, engine_counters=both)
            serial = greedy_runs.get(arm.name, {}).get("outputs") if greedy_runs else None
            if serial is not None:
                same = [r["tokens"] == s[: len(r["tokens"])] and len(r["tokens"]) > 0 for r, s in zip(run["results"], serial)]
                entry[f"{arm.name}_identical_to_serial"] = all(same)
        out[label] = entry
    return out


def _per_patch(root: Path, manifest: Manifest, adapter: EngineAdapter, stock: Arm, models: Models,
               prompts: list[dict[str, Any]], prompt_ids: list[list[int]], options: CheckOptions, tmp: Path,
               reporter: Reporter, gates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    series = load_engine_series(root, manifest)
    arms = [stock]
    for i in range(1, len(series.patches) + 1):
        build = apply_engine(root=root, engine=manifest.name, upto=i, reporter=reporter)
        arms.append(arm_env(root, manifest, build.wheel, name=f"upto-{i}", reporter=reporter))
    tasks = adapter.tasks()
    greedy: dict[str, dict[str, Any]] = {}
    logits_files: dict[str, list[str]] = {}
    seqs = teacher_sequences(adapter, stock, models, positions=min(options.positions, 8192), seq_len=options.seq_len)
    for arm in arms:
        reporter.step("check", f"per-patch: {arm.name} ({arm.version})")
        if "greedy" in tasks:
            (tmp / f"pg-{arm.name}").mkdir(exist_ok=True)
            greedy[arm.name] = adapter.run(arm, {"task": "greedy", "model": str(models.target), "prompts": prompt_ids,
                                                 "max_tokens": options.max_tokens, "out": str(tmp / f"pg-{arm.name}")})
        if "logits" in tasks:
            (tmp / f"pl-{arm.name}").mkdir(exist_ok=True)
            logits_files[arm.name] = adapter.run(arm, {"task": "logits", "model": str(models.target), "sequences": seqs,
                                                       "vocab_size": prompts[0].get("vocab_size"),
                                                       "out": str(tmp / f"pl-{arm.name}")})["files"]
    samples = speed_runs(adapter, arms, models, prompt_ids[0] * 4, reps=max(1, options.reps), decode_tokens=options.decode_tokens,
                         reporter=reporter, cold=False) if "speed" in tasks else None
    rows = []
    for i, patch in enumerate(series.patches, start=1):
        prev, cur = arms[i - 1].name, arms[i].name
        g = compare_greedy(greedy[prev], greedy[cur], prompts) if greedy else None
        lg = logit_agreement(logits_files[prev], logits_files[cur], seqs) if logits_files else None
        row: dict[str, Any] = {"patch": patch.name, "subject": patch.subject, "numerics": patch.numerics,
                               "greedy_identical_to_previous": g["identical"] if g else None,
                               "logits_vs_previous": None if lg is None else {
                                   k: lg[k] for k in ("bit_identical", "max_abs_diff", "kld_mean", "top1_agreement")}}
        if samples is not None:
            row["decode_ratio_vs_previous"] = stats.ratio_ci(samples[cur]["decode_tok_s"], samples[prev]["decode_tok_s"])
            row["decode_ratio_vs_stock"] = stats.ratio_ci(samples[cur]["decode_tok_s"], samples["stock"]["decode_tok_s"])
        gates += gates_for(patch.numerics or "approximate", greedy=g, logits=lg, spec=None, manifest=manifest, who=patch.name)
        rows.append(row)
    return rows


def _finish(root: Path, options: CheckOptions, manifest: Manifest, report: dict[str, Any],
            gates: list[dict[str, Any]]) -> dict[str, Any]:
    report["gates"] = gates
    failed = [g for g in gates if not g["passed"]]
    report["verdict"] = "fail" if failed else "pass"
    json_path = options.json_path or reports_dir(root) / f"{manifest.name}-check.json"
    atomic_write_json(json_path, report)
    html_path = options.html_path or reports_dir(root) / f"{manifest.name}-check.html"
    from overlay.check.html import render

    atomic_write_text(html_path, render(report))
    report["_paths"] = {"json": str(json_path), "html": str(html_path)}
    if failed:
        first = failed[0]
        exc = CheckFailed(
            f"{len(failed)} gate(s) failed; first: {first['subject']} [{first['class']}] {first['gate']}: {first['detail']}",
            tip=f"see {json_path}",
        )
        exc.report = report  # type: ignore[attr-defined]
        raise exc
    return report
