#!/usr/bin/env python3
"""The device census of `overlay check` on one NVIDIA GPU with no network: SGLang, ExLlamaV3 and vLLM in one command
that fits one H200 in 15 minutes (start-up, builds and a rerun included). Entry: ``bash scripts/device_check.sh``.

    scripts/device_check.sh prepare            # HERE (package index reachable): fetch the pinned artifacts, stage the
                                               # wheels the GPU image lacks in .whl/, make vLLM's carry
                                               # (build/device-carry/vllm); prints the device tool's carry
    scripts/device_check.sh run [--budget S]   # ON THE GPU MACHINE (default 540 s): builds the patched wheels offline
                                               # with overlay itself, then measures; writes $OUT/device-check.json
    scripts/device_check.sh run --dry-run      # the same run on a CPU machine (the engines' CPU test arms)
    scripts/device_check.sh plan ENGINE        # the plan resolved against the series as it is (JSON on stdout)

What one run does (budget plan: scripts/device/plan.py ``split_budget``; the plan is printed first):

1. setup: the carried wheels into /tmp/ovl-site, ``overlay apply`` of both series offline, the plan resolved from the
   patches' trailers (every declared mechanism: a probe, or why one GPU cannot measure it);
2. ExLlamaV3's extension builds start in the background (stock, then only the units the series changes:
   scripts/device/exllamav3_check.py ``--phase build``) while SGLang's probes run on the GPU
   (scripts/device/sglang_check.py);
3. vLLM's check (scripts/device/vllm_check.py) on the GPU after SGLang's, while the builds still run: the series'
   sampling patches gate themselves to the CPU path, so it checks that CUDA takes stock's path (outputs bit for bit,
   census, none of the series' functions entered) and times a go/no-go for a CUDA variant of 0008;
4. ExLlamaV3's probes once its builds are done, with what is left of the budget;
5. the report: per engine, census records in the shape of ``overlay check --mechanism`` (patch, metric, direction,
   scenario, declared, flag, stock, flag_off, patched, before, after, holds, sites, note) plus time (median
   microseconds per step before/after, their ratio and a bootstrap interval), the engines' raw reports, the budget
   used; ``$OUT/device-check.json`` (or build/reports/device-check.json) and one line per record on stdout.

Every probe or phase that does not fit is skipped with its reason; a mechanism is "holds" only when measured. mlx-lm's
GPU arm is not carried (the mlx CUDA wheel, ~90 MB, is over the carry limit; mlx-lm is checked for real on CPU).
Exit 0: the engines ran and no measured mechanism fails (nor a vLLM probe finds CUDA changed); 4: a declared mechanism
does not hold on the GPU, a vLLM patch changes CUDA, or an engine check failed or ran out of time; 2: bad input or
setup. A dry run's numbers are the CPU census's: it exits 4 only when the harness itself fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "scripts" / "device"))

import plan
import records
import vllm_prepare
import vllm_records

from overlay.core.build import apply_engine, select_artifact
from overlay.core.fetch import cached_path, fetch_artifact
from overlay.core.manifest import load_engine
from overlay.fsutil import atomic_write_json

CARRY_LIMIT = 64 * 1024 * 1024
ENGINES = ("sglang", "exllamav3", "vllm")
SGLANG_EXTRA_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
SGLANG_EXTRA = [
    "msgspec",
    "orjson",
    "pybase64",
    "pyzmq",
    "setproctitle",
    "partial_json_parser",
    "interegular",
    "xgrammar==0.2.7",
    "compressed-tensors==0.18.0",
    "apache-tvm-ffi==0.1.11",
    # ExLlamaV3's imports the GPU image lacks (vLLM's import needs pydantic, msgspec, pyzmq, xgrammar, pybase64 and
    # partial_json_parser from this list too; the rest of its needs travel in build/device-carry/vllm)
    "marisa-trie",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
]


def sglang_artifact(dry: bool) -> str:
    manifest = load_engine(REPO, "sglang")
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    names = [a.filename for a in manifest.upstream.artifacts]
    if dry:
        return manifest.upstream.primary.filename
    for name in names:
        if f"-{py}-" in name:
            return name
    raise SystemExit(
        f"error: no pinned sglang wheel for {py}: pinned are {names}; run with Python 3.12 (the GPU "
        f"image's python3)"
    )


def size(path: Path) -> int:
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        if path.is_dir()
        else path.stat().st_size
    )


def prepare() -> int:
    carry = []
    for engine, name in (
        ("exllamav3", None),
        ("sglang", "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"),
    ):
        manifest = load_engine(REPO, engine)
        artifact = select_artifact(manifest, name)
        carry.append(fetch_artifact(REPO, manifest, artifact).parent)
    whl = REPO / ".whl"
    whl.mkdir(exist_ok=True)
    exclude = REPO / ".git" / "info" / "exclude"
    if exclude.parent.is_dir() and "/.whl/" not in (exclude.read_text() if exclude.exists() else ""):
        with exclude.open("a") as fh:
            fh.write("/.whl/\n")
    proc = subprocess.run(
        vllm_prepare.cp312_pip("download", "-d", str(whl), *SGLANG_EXTRA, platforms=SGLANG_EXTRA_PLATFORMS),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        print(f"note: not every dependency was staged: {proc.stderr.strip()[-300:]}", file=sys.stderr)
    carry.append(whl)
    try:
        vllm_prepare.prepare()
    except vllm_prepare.PrepareError as exc:
        print(f"error: vLLM's carry: {exc}", file=sys.stderr)
        return 2
    carry.append(vllm_prepare.CARRY)
    total = sum(size(p) for p in carry)
    print(f"carry ({total} bytes of {CARRY_LIMIT}, the working tree counts too):")
    outside = [p for p in carry if not p.resolve().is_relative_to(REPO)]
    for p in carry:
        print(f"  {p.relative_to(REPO) if p not in outside else p}")
    if outside:
        print(
            "error: the device tool carries only paths inside the repository: prepare without OVERLAY_BUILD_DIR or "
            "OVERLAY_CACHE_DIR pointing elsewhere",
            file=sys.stderr,
        )
        return 2
    if total > CARRY_LIMIT:
        print("over the 64 MiB carry limit", file=sys.stderr)
        return 2
    return 0


def _log(msg: str) -> None:
    print(f"device-check: {msg}", file=sys.stderr, flush=True)


def run(budget: float, dry: bool, engines: tuple[str, ...]) -> int:
    start = time.monotonic()
    out = Path(os.environ.get("OUT") or REPO / "build" / "reports")
    out.mkdir(parents=True, exist_ok=True)
    logs = REPO / "build" / "device"
    logs.mkdir(parents=True, exist_ok=True)
    split = plan.split_budget(budget, vllm="vllm" in engines)
    _log("budget plan: " + ", ".join(f"{k} {int(v)} s" for k, v in split.items()))
    env = dict(os.environ)
    whl = REPO / ".whl"
    if whl.is_dir() and any(whl.glob("*.whl")) and not dry:
        site = Path("/tmp/ovl-site")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--upgrade",
                "--target",
                str(site),
                *map(str, whl.glob("*.whl")),
            ],
            check=True,
        )
        env["PYTHONPATH"] = f"{site}:{env.get('PYTHONPATH', '')}".rstrip(":")
    wheels = logs / "wheels"
    pythons: dict[str, tuple[str, dict[str, str]]] = dict.fromkeys(ENGINES, (sys.executable, env))
    built: dict[str, tuple[Path, Path]] = {}
    resolved: dict[str, dict[str, Any]] = {}
    vllm_unready = None
    # the vLLM trees come from prepare (the CUDA wheel cannot travel): no `overlay apply` for vLLM here
    if "vllm" in engines:
        resolved["vllm"] = vllm_records.resolve(REPO)
        (logs / "plan-vllm.json").write_text(json.dumps(resolved["vllm"], indent=2))
        vllm_unready = vllm_prepare.stale()
        if vllm_unready and dry:  # a dry run runs where prepare can
            _log(f"vllm: {vllm_unready}: preparing")
            try:
                vllm_prepare.prepare()
            except vllm_prepare.PrepareError as exc:
                _log(f"vllm: prepare failed: {exc}")
            vllm_unready = vllm_prepare.stale()
        for probe in plan.VLLM_PROBES:
            _log(
                f"plan vllm {probe.key}: " + (f"skip (pending: {probe.pending})" if probe.pending else "run")
            )
        if dry:  # the vLLM CPU arm's dependencies and torch (the trees come from the carry)
            from overlay.check.envs import deps_env, runtime_env

            manifest = load_engine(REPO, "vllm")
            pythons["vllm"] = (
                str(deps_env(REPO, manifest) / "bin" / "python"),
                {**os.environ, **runtime_env(REPO, manifest)},
            )
        else:
            pythons["vllm"] = (sys.executable, env)
    for engine in (e for e in engines if e != "vllm"):
        name = sglang_artifact(dry) if engine == "sglang" else None
        manifest = load_engine(REPO, engine)
        stock = cached_path(REPO, select_artifact(manifest, name))
        patched = apply_engine(
            root=REPO, engine=engine, artifact_name=name, out_dir=wheels, offline=True
        ).wheel
        built[engine] = (stock, patched)
        resolved[engine] = records.resolve(REPO, engine)
        (logs / f"plan-{engine}.json").write_text(json.dumps(resolved[engine], indent=2))
        for planned in plan.budget_plan(engine, split["sglang" if engine == "sglang" else "exllamav3"]):
            _log(
                f"plan {engine} {planned.probe.key}: "
                + ("run" if planned.run else f"skip ({planned.reason})")
            )
        if dry:  # the CPU test arms hold torch and the stand-ins
            from overlay.check.envs import arms_for

            arm = arms_for(REPO, engine).patched
            pythons[engine] = (str(arm.python), {**os.environ, **arm.env})
    results: dict[str, dict[str, Any]] = {}
    build_proc = None
    ex_cmd = []
    if "exllamav3" in engines:
        ex_py, ex_env = pythons["exllamav3"]
        ex_cmd = [
            ex_py,
            "scripts/device/exllamav3_check.py",
            "--stock",
            str(built["exllamav3"][0]),
            "--patched",
            str(built["exllamav3"][1]),
            "--plan",
            str(logs / "plan-exllamav3.json"),
            *(["--dry-run"] if dry else []),
        ]
        build_log = (logs / "exllamav3-build.log").open("w")
        build_proc = subprocess.Popen(
            [
                *ex_cmd,
                "--phase",
                "build",
                "--budget",
                str(int(split["exllamav3_build"])),
                "--out",
                str(logs / "exllamav3-build.json"),
            ],
            cwd=REPO,
            env={**ex_env, "PYTHONUNBUFFERED": "1"},
            stdout=build_log,
            stderr=subprocess.STDOUT,
        )
    if "sglang" in engines:
        sg_py, sg_env = pythons["sglang"]
        cmd = [
            sg_py,
            "scripts/device/sglang_check.py",
            "--stock",
            str(built["sglang"][0]),
            "--patched",
            str(built["sglang"][1]),
            "--plan",
            str(logs / "plan-sglang.json"),
            "--out",
            str(out / "sglang-device.json"),
            "--budget",
            str(int(split["sglang"] - 15)),
            *(["--dry-run", "--rounds", "4"] if dry else []),
        ]
        results["sglang"] = _run_engine(
            "sglang", cmd, sg_env, split["sglang"], out / "sglang-device.json", logs
        )
    if "vllm" in engines:
        if vllm_unready:
            _log(f"vllm: not run: {vllm_unready}")
            results["vllm"] = {
                "exit_code": 2,
                "timed_out": False,
                "seconds": 0.0,
                "log": None,
                "report": None,
            }
            results["vllm"]["skipped"] = vllm_unready
        else:
            vl_py, vl_env = pythons["vllm"]
            cmd = [
                vl_py,
                "scripts/device/vllm_check.py",
                "--plan",
                str(logs / "plan-vllm.json"),
                "--out",
                str(out / "vllm-device.json"),
                "--logs",
                str(logs),
                "--budget",
                str(int(max(30, split["vllm"] - 10))),
                *(["--dry-run", "--rounds", "4"] if dry else []),
            ]
            results["vllm"] = _run_engine("vllm", cmd, vl_env, split["vllm"], out / "vllm-device.json", logs)
    if build_proc is not None:
        left = max(
            10.0, split["setup"] + max(split["sglang"], split["exllamav3_build"]) - (time.monotonic() - start)
        )
        try:
            build_rc = build_proc.wait(timeout=left + 15)
        except subprocess.TimeoutExpired:
            build_proc.kill()
            build_rc = 124
        _log(f"exllamav3 build phase: exit {build_rc}")
        left = budget - split["report"] - (time.monotonic() - start)
        results["exllamav3"] = _run_engine(
            "exllamav3",
            [
                *ex_cmd,
                "--phase",
                "probes",
                "--budget",
                str(int(max(0, left - 10))),
                "--out",
                str(out / "exllamav3-device.json"),
            ],
            pythons["exllamav3"][1],
            max(30.0, left),
            out / "exllamav3-device.json",
            logs,
        )
        results["exllamav3"]["build_exit_code"] = build_rc
    for engine in engines:
        if engine == "vllm":
            recs = vllm_records.records(resolved[engine], results[engine].get("report"))
            results[engine]["records"] = recs
            results[engine]["summary"] = vllm_records.summary(recs, results[engine].get("report"))
            continue
        recs = records.records(resolved[engine], results[engine].get("report"))
        results[engine]["records"] = recs
        results[engine]["summary"] = records.summary(recs)
    results["mlx-lm"] = {
        "skipped": "the mlx CUDA wheel (~90 MB) is over the 64 MiB carry limit; mlx-lm is checked "
        "for real on CPU by `overlay check mlx-lm`"
    }
    gpu = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        pass
    harness_ok = all(results[e]["exit_code"] in (0, 4) and results[e].get("report") for e in engines)
    failing = [r for e in engines for r in results[e]["records"] if r["holds"] is False]
    if "vllm" in engines:
        failing += vllm_records.neutral_failures(results["vllm"].get("report"), dry_run=dry)
    ok = harness_ok and (dry or not failing)
    report = {
        "version": 2,
        "kind": "device-check",
        "dry_run": dry,
        "gpu": gpu,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - start, 1),
        "budget": {"seconds": budget, "plan": split},
        "engines": results,
        "verdict": "pass" if ok else "fail",
    }
    atomic_write_json(out / "device-check.json", report)
    for engine in engines:
        for r in results[engine]["records"]:
            verdict = {True: "holds", False: "DOES NOT HOLD", None: "not measured"}[r["holds"]]
            t = r.get("time") or {}
            timing = f" time x{t['ratio']} {t.get('ci')}" if t.get("ratio") else ""
            print(
                f"{engine} {verdict:<13} {r['patch'][:44]}: {r['declared']} [{r['flag']}] "
                f"{r['before']} -> {r['after']}{timing}  ({str(r['note'])[:160]})"
            )
    if "vllm" in engines:
        _print_vllm(results["vllm"].get("report"), dry)
    codes = ", ".join(f"{e} exit {results[e]['exit_code']}" for e in engines)
    sums = "; ".join(f"{e}: {results[e]['summary']}" for e in engines)
    print(
        f"device-check: {report['verdict']} ({codes}; {sums}; {report['seconds']} s) -> {out / 'device-check.json'}"
    )
    return 0 if ok else 4


def _print_vllm(report: dict[str, Any] | None, dry: bool) -> None:
    """One line per vLLM probe (neutral on CUDA or not), and the 0008 go/no-go per batch size."""
    if not report:
        return
    for m in report.get("measurements", []):
        if m["key"] == "imports":
            by = m.get("by_config") or {}
            line = ", ".join(
                f"{c} {(by.get(c) or {}).get('vllm_modules')}" for c in ("stock", "flag_off", "patched")
            )
            print(f"vllm imports       vLLM modules imported by the probed modules: {line}")
            continue
        verdict = {True: "neutral", False: "CPU path" if dry else "NOT NEUTRAL", None: "not measured"}[
            m.get("neutral")
        ]
        bad = [f"{n}: {c['why']}" for n, c in (m.get("cases") or {}).items() if c.get("neutral") is not True]
        print(f"vllm {verdict:<13} {m['key']}: {m.get('reason') or (bad[0][:200] if bad else 'every case')}")
    for rows, t in ((report.get("timing") or {}).get("by_rows") or {}).items():
        lo, fb = t["dense_lower_bound_vs_sparse"], t["dense_view_vs_sparse"]
        where = "on the CPU (dry run)" if dry else "on CUDA"
        print(
            f"vllm 0008 {where}, {rows} rows: {t['verdict']} (stock/0008 time: x{lo['ratio']} {lo['ci']} against "
            f"stock without its repetition kernel, x{fb['ratio']} {fb['ci']} against its PyTorch fallback; "
            f"0008's host syncs {t['census']['sparse_0008']['host-syncs']})"
        )


def _run_engine(
    engine: str, cmd: list[str], env: dict[str, str], seconds: float, path: Path, logs: Path
) -> dict[str, Any]:
    t0 = time.monotonic()
    if path.is_file():
        path.unlink()
    try:
        with (logs / f"{engine}.log").open("w") as log:
            rc = subprocess.run(
                cmd,
                cwd=REPO,
                env={**env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=max(seconds, 30),
            ).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    _log(f"{engine}: exit {rc} in {time.monotonic() - t0:.0f} s (log {logs / (engine + '.log')})")
    return {
        "exit_code": rc,
        "timed_out": rc == 124,
        "seconds": round(time.monotonic() - t0, 1),
        "log": str(logs / f"{engine}.log"),
        "report": json.loads(path.read_text()) if path.is_file() else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    sub.add_parser("prepare", help="stage what the GPU machine needs; print the carry list")
    p = sub.add_parser("plan", help="print the plan resolved against the series (JSON)")
    p.add_argument("engine", choices=ENGINES)
    r = sub.add_parser("run", help="run the device census and write device-check.json")
    r.add_argument(
        "--budget",
        type=float,
        default=plan.DEFAULT_BUDGET_S,
        help=f"seconds for the whole run (default {plan.DEFAULT_BUDGET_S})",
    )
    r.add_argument("--engine", choices=ENGINES, action="append", help="only this engine (repeatable)")
    r.add_argument(
        "--dry-run", action="store_true", help="CPU: the engines' test arms, stand-ins, the CPU census"
    )
    args = ap.parse_args()
    if args.mode == "prepare":
        return prepare()
    if args.mode == "plan":
        resolved = vllm_records.resolve(REPO) if args.engine == "vllm" else records.resolve(REPO, args.engine)
        print(json.dumps(resolved, indent=2))
        return 0
    if args.budget < plan.SETUP_S + plan.REPORT_S + 30:
        print(
            f"device-check: error: --budget {args.budget} is too small: setup and report alone take "
            f"{plan.SETUP_S + plan.REPORT_S} s; give at least {plan.SETUP_S + plan.REPORT_S + 30}",
            file=sys.stderr,
        )
        return 2
    return run(args.budget, args.dry_run, tuple(args.engine or ENGINES))


if __name__ == "__main__":
    raise SystemExit(main())
