"""A check's gates (what passes at each numerics class, speed, sampling distribution) and its report's last step:
the verdict, the JSON and HTML files (written before a failing gate raises CheckFailed, exit 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlay.check.options import MIN_SPEED_GATE_REPS, CheckOptions
from overlay.core.manifest import Manifest
from overlay.errors import CheckFailed, UsageError
from overlay.fsutil import atomic_write_json, atomic_write_text
from overlay.paths import layout


def reports_dir(root: Path) -> Path:
    return layout(root).reports


def gates_for(
    cls: str,
    *,
    greedy: dict[str, Any] | None,
    logits: dict[str, Any] | None,
    spec: dict[str, Any] | None,
    manifest: Manifest,
    who: str,
) -> list[dict[str, Any]]:
    gates: list[dict[str, Any]] = []

    def gate(name: str, passed: bool, detail: str) -> None:
        gates.append({"subject": who, "class": cls, "gate": name, "passed": bool(passed), "detail": detail})

    if cls == "exact":
        if logits is not None and logits.get("positions"):
            gate(
                "logits bit-identical",
                logits["bit_identical"],
                f"max |d logprob| = {logits['max_abs_diff']:.3g} over {logits['positions']} positions",
            )
        if greedy is not None:
            gate(
                "greedy identical",
                greedy["identical"],
                f"{greedy['identical_count']}/{greedy['prompts']} prompts",
            )
            gate(
                "greedy logprobs bit-identical",
                greedy["logprobs_bit_identical"],
                f"max |d| = {greedy['logprobs_max_abs_diff']:.3g}",
            )
    elif cls == "lossless":
        if greedy is not None:
            gate(
                "greedy identical",
                greedy["identical"],
                f"{greedy['identical_count']}/{greedy['prompts']} prompts",
            )
        if spec is not None and "self" in spec and "error" not in spec["self"]["patched"]:
            rate = spec["self"]["patched"].get("engine", spec["self"]["patched"])["acceptance_rate"]
            gate("self-draft acceptance >= 0.98", rate >= 0.98, f"rate {rate:.3f}")
    else:
        if logits is not None and logits.get("positions"):
            gate(
                f"KLD mean <= {manifest.check.kld_max:g}",
                logits["kld_mean"] <= manifest.check.kld_max,
                f"{logits['kld_mean']:.3g} +/- {logits['kld_se']:.2g}",
            )
            gate(
                f"top-1 >= {manifest.check.top1_min:g}",
                logits["top1_agreement"] >= manifest.check.top1_min,
                f"{logits['top1_agreement']:.4f}",
            )
    for label, entry in (spec or {}).items():
        if isinstance(entry, dict) and "error" in (entry.get("patched") or {}):
            gate(f"speculative {label}: runs in the patched arm", False, entry["patched"]["error"][-300:])
    if spec is not None and "never" in spec and "error" not in spec["never"]["patched"]:
        gate(
            "never-right draft: output identical to serial",
            spec["never"]["patched_identical_to_serial"],
            f"acceptance {spec['never']['patched']['acceptance_rate']:.3f}",
        )
    return gates


def check_speed_gate(options: CheckOptions) -> None:
    """Refuse a speed gate its interval cannot support (before anything runs)."""
    if options.min_speedup is not None and options.reps < MIN_SPEED_GATE_REPS:
        raise UsageError(
            f"--min-speedup needs at least {MIN_SPEED_GATE_REPS} speed repetitions; --reps is {options.reps}",
            tip=f"pass --reps {MIN_SPEED_GATE_REPS} or more (the 95% interval of a ratio from fewer paired "
            "repetitions is too wide to gate on), or drop --min-speedup",
        )
    if options.min_speedup is not None and not options.min_speedup > 0:
        raise UsageError(
            f"--min-speedup {options.min_speedup:g} must be above 0", tip="e.g. --min-speedup 1.05"
        )


def speed_gate(ratio: dict[str, Any], min_speedup: float) -> dict[str, Any]:
    """The decode speed gate: passes when the interval's low end reaches ``min_speedup`` and the interval does not
    span 1.0; an interval that spans 1.0 is "inconclusive" (not a pass: more repetitions can decide it)."""
    low, high = ratio["ci_low"], ratio["ci_high"]
    verdict = ratio.get("verdict")
    if verdict == "inconclusive":
        status = "inconclusive"
    else:
        status = "pass" if low >= min_speedup else "fail"
    return {
        "subject": "series",
        "class": "speed",
        "gate": f"decode speedup CI low >= {min_speedup:g}",
        "passed": status == "pass",
        "status": status,
        "detail": f"ratio {ratio['ratio']:.3f}, 95% CI [{low:.3f}, {high:.3f}] over {ratio['n']} paired reps"
        + (
            "; the interval spans 1.0: INCONCLUSIVE (more --reps, a quieter machine)"
            if status == "inconclusive"
            else ""
        ),
    }


def finish(
    root: Path, options: CheckOptions, manifest: Manifest, report: dict[str, Any], gates: list[dict[str, Any]]
) -> dict[str, Any]:
    """Verdict, files, and CheckFailed (exit 4) when a gate did not pass ("fail", or "inconclusive" when only
    inconclusive gates did not pass)."""
    from overlay.check.host import load_average

    report.setdefault("host", {})["load_average_end"] = load_average()
    for g in gates:
        g.setdefault("status", "pass" if g["passed"] else "fail")
    report["gates"] = gates
    failed = [g for g in gates if not g["passed"]]
    hard = [g for g in failed if g["status"] != "inconclusive"]
    report["verdict"] = "fail" if hard else "inconclusive" if failed else "pass"
    json_path = options.json_path or reports_dir(root) / f"{manifest.name}-check.json"
    html_path = options.html_path or reports_dir(root) / f"{manifest.name}-check.html"
    from overlay.check.html import render

    atomic_write_json(json_path, report)
    atomic_write_text(html_path, render(report))
    report["_paths"] = {"json": str(json_path), "html": str(html_path)}
    if failed:
        first = (hard or failed)[0]
        inconclusive = len(failed) - len(hard)
        what = (
            f"{len(hard)} gate(s) failed" + (f", {inconclusive} inconclusive" if inconclusive else "")
            if hard
            else f"{inconclusive} gate(s) inconclusive (none failed)"
        )
        exc = CheckFailed(
            f"{what}; first: {first['subject']} [{first['class']}] {first['gate']}: {first['detail']}",
            tip=f"see {json_path}",
        )
        exc.report = report  # type: ignore[attr-defined]
        raise exc
    return report
