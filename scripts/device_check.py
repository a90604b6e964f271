#!/usr/bin/env python3
"""GPU arms of `overlay check`, as one prepared script for an NVIDIA GPU machine with no network.

    scripts/device_check.sh prepare            # HERE (package index reachable): fetch the pinned artifacts, build
                                               # the tiny model, stage extra wheels; prints the device tool's `carry`
                                               # list (<= 64 MiB in all)
    scripts/device_check.sh run [--budget S]   # ON THE GPU MACHINE: builds the patched wheels offline with overlay
                                               # itself (the series travel with the tree), runs the engines' device
                                               # checks within the budget (default 450 s: under 8 minutes) and writes
                                               # $OUT/device-check.json (or build/reports/device-check.json)
    scripts/device_check.sh run --dry-run      # the same harness on a CPU machine, in the CPU test arms

GPU work: ExLlamaV3 (JIT-built extension: ring vs unbounded bitwise, drafter memory at long context, tokens stock vs
patched, time per round, cold start; scripts/device/exllamav3_check.*) and SGLang's GPU-relevant patches as
kernel/step micro-benchmarks with graph-replay equality (scripts/device/sglang_check.py). mlx-lm's GPU arm is not
carried: the mlx CUDA wheel (mlx-cuda-13, ~90 MB) is over the carry limit; mlx-lm runs for real on CPU.
Exit 0 when both engine checks pass, 4 when one fails or runs out of time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from overlay.core.build import apply_engine, select_artifact
from overlay.core.fetch import cached_path, fetch_artifact
from overlay.core.manifest import load_engine
from overlay.fsutil import atomic_write_json

CARRY_LIMIT = 64 * 1024 * 1024
SGLANG_EXTRA = ["msgspec", "orjson", "pybase64", "pyzmq", "setproctitle", "partial_json_parser", "interegular",
                "xgrammar==0.2.7", "compressed-tensors==0.18.0", "apache-tvm-ffi==0.1.11"]


def sglang_artifact(dry: bool) -> str:
    manifest = load_engine(REPO, "sglang")
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    names = [a.filename for a in manifest.upstream.artifacts]
    if dry:
        return manifest.upstream.primary.filename
    for name in names:
        if f"-{py}-" in name:
            return name
    raise SystemExit(f"no pinned sglang wheel for {py}: pinned are {names}")


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def prepare() -> int:
    from overlay.check import models as tinymodels

    carry = []
    for engine, name in (("exllamav3", None), ("sglang", "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl")):
        manifest = load_engine(REPO, engine)
        artifact = select_artifact(manifest, name)
        carry.append(fetch_artifact(REPO, manifest, artifact).parent)
    carry.append(tinymodels.build("llama-target", root=REPO, python=tinymodels.stock_mlx_python(REPO)))
    whl = REPO / ".whl"
    whl.mkdir(exist_ok=True)
    exclude = REPO / ".git" / "info" / "exclude"
    if exclude.parent.is_dir() and "/.whl/" not in (exclude.read_text() if exclude.exists() else ""):
        with exclude.open("a") as fh:
            fh.write("/.whl/\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                           "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                           "-d", str(whl), *SGLANG_EXTRA], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"note: not every SGLang dependency was staged: {proc.stderr.strip()[-300:]}", file=sys.stderr)
    carry.append(whl)
    total = sum(size(p) for p in carry)
    print(f"carry ({total} bytes of {CARRY_LIMIT}):")
    for p in carry:
        print(f"  {p.relative_to(REPO)}")
    if total > CARRY_LIMIT:
        print("over the 64 MiB carry limit", file=sys.stderr)
        return 2
    return 0


def run(budget: int, dry: bool) -> int:
    start = time.monotonic()
    out = Path(os.environ.get("OUT") or REPO / "build" / "reports")
    out.mkdir(parents=True, exist_ok=True)
    logs = REPO / "build" / "device"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    whl = REPO / ".whl"
    if whl.is_dir() and any(whl.glob("*.whl")) and not dry:
        site = Path("/tmp/ovl-site")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(site), *map(str, whl.glob("*.whl"))], check=True)
        env["PYTHONPATH"] = f"{site}:{env.get('PYTHONPATH', '')}".rstrip(":")
    wheels = REPO / "build" / "device" / "wheels"
    sg_name = sglang_artifact(dry)
    pythons = {"exllamav3": (sys.executable, env), "sglang": (sys.executable, env)}
    built = {}
    for engine, name in (("exllamav3", None), ("sglang", sg_name)):
        manifest = load_engine(REPO, engine)
        stock = cached_path(REPO, select_artifact(manifest, name))
        patched = apply_engine(root=REPO, engine=engine, artifact_name=name, out_dir=wheels, offline=True).wheel
        built[engine] = (stock, patched)
        if dry:  # the CPU test arms hold torch and the stand-ins
            from overlay.check.envs import arms_for

            arm = arms_for(REPO, engine).patched
            pythons[engine] = (str(arm.python), {**os.environ, **arm.env})
    left = budget - (time.monotonic() - start)
    ex_time, sg_time = int(left * 2 / 3), int(left / 3) - 10
    results = {}
    for engine, cmd, secs in (
        ("exllamav3", [pythons["exllamav3"][0], "scripts/device/exllamav3_check.py",
                       *([] if dry else ["--shared-ext"]),
                       "--stock", str(built["exllamav3"][0]), "--patched", str(built["exllamav3"][1]),
                       "--out", str(out / "exllamav3-device.json"), *(["--dry-run"] if dry else [])], ex_time),
        ("sglang", [pythons["sglang"][0], "scripts/device/sglang_check.py", "--stock", str(built["sglang"][0]),
                    "--patched", str(built["sglang"][1]), "--out", str(out / "sglang-device.json"),
                    *(["--dry-run", "--iters", "2"] if dry else [])], sg_time),
    ):
        t0 = time.monotonic()
        try:
            with (logs / f"{engine}.log").open("w") as log:
                rc = subprocess.run(cmd, cwd=REPO, env={**pythons[engine][1], "PYTHONUNBUFFERED": "1"},
                                    stdout=log, stderr=subprocess.STDOUT, timeout=max(secs, 30)).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        path = out / f"{engine}-device.json"
        results[engine] = {"exit_code": rc, "timed_out": rc == 124, "seconds": round(time.monotonic() - t0, 1),
                           "log": str(logs / f"{engine}.log"),
                           "report": json.loads(path.read_text()) if path.is_file() else None}
    results["mlx-lm"] = {"skipped": "the mlx CUDA wheel (~90 MB) is over the 64 MiB carry limit; mlx-lm is checked "
                                    "for real on CPU by `overlay check mlx-lm`"}
    gpu = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        pass
    ok = all(results[e]["exit_code"] == 0 for e in ("exllamav3", "sglang"))
    report = {"version": 1, "kind": "device-check", "dry_run": dry, "gpu": gpu,
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "seconds": round(time.monotonic() - start, 1), "budget_s": budget,
              "engines": results, "verdict": "pass" if ok else "fail"}
    atomic_write_json(out / "device-check.json", report)
    codes = ", ".join(f"{e} exit {results[e]['exit_code']}" for e in ("exllamav3", "sglang"))
    print(f"device-check: {report['verdict']} ({codes}, {report['seconds']} s) -> {out / 'device-check.json'}")
    return 0 if ok else 4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    sub.add_parser("prepare", help="stage what the GPU machine needs; print the carry list")
    r = sub.add_parser("run", help="run the GPU arms and write device-check.json")
    r.add_argument("--budget", type=int, default=450, help="seconds for the whole run (default 450)")
    r.add_argument("--dry-run", action="store_true", help="CPU: the engines' test arms, stand-ins, reference kernels")
    args = ap.parse_args()
    return prepare() if args.mode == "prepare" else run(args.budget, args.dry_run)


if __name__ == "__main__":
    raise SystemExit(main())
