#!/usr/bin/env python3
"""ExLlamaV3 stock vs patched checks on an NVIDIA GPU machine with no network.

Runs the same probes as tests/engines/exllamav3 (stock wheel vs the wheel `overlay apply exllamav3` built), but on
CUDA with the real extension (JIT-built here) and the real Triton kernels:

- cold start: first `import exllamav3` per arm into an empty TORCH_EXTENSIONS_DIR (JIT build), then a warm import;
- ring vs unbounded: the SlidingAttention window schedules of probes/swa_ring.py on the GPU kernels; stock linear
  buffer vs patched ring (EXL3_OVL_SWA_RING=1) bit for bit, and both against an unbounded K/V history (tolerance);
  the Q8 ring's output error against the same history, next to the fp16 ring's;
- drafter memory at long context: a synthetic DFlash2 drafter's cache really allocated at 384K tokens, stock vs
  patched --draft_window (torch.cuda.memory_allocated delta);
- round time: the drafter input path (probes/dflash_input.py) is CPU-side; timings there are reported per arm.

`--dry-run` runs the same harness on CPU with the extension stand-in (test infrastructure), reference kernels and
meta-only memory, so the script itself is exercised where there is no GPU. The JSON report is written atomically.

Not covered yet (needs a random-weight EXL3 target + DFlash2 checkpoint writer): end-to-end token identity and
time per speculative round through Generator; see docs/engines/exllamav3.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBES = REPO / "tests" / "engines" / "exllamav3" / "probes"
STANDIN = REPO / "src" / "overlay" / "testbackends" / "exllamav3" / "pythonpath"
DEPS = ["torch", "triton", "numpy", "safetensors", "tokenizers", "pydantic", "marisa_trie", "rich", "yaml", "PIL"]


class CheckError(RuntimeError):
    pass


def find_wheels(args: argparse.Namespace) -> tuple[Path, Path]:
    stock = Path(args.stock) if args.stock else next(iter(sorted(
        (REPO / "build" / "cache").rglob("exllamav3-1.6.5-py3-none-any.whl"))), None)
    patched = Path(args.patched) if args.patched else next(iter(sorted(
        (REPO / "build" / "wheels" / "exllamav3").glob("exllamav3-1.6.5+ovl*.whl"), key=lambda p: p.stat().st_mtime,
        reverse=True)), None)
    if stock is None or not stock.is_file():
        raise CheckError(f"stock wheel not found ({args.stock or 'build/cache/**/exllamav3-1.6.5-py3-none-any.whl'}); "
                         "run `overlay fetch exllamav3` and carry build/cache, or pass --stock WHEEL")
    if patched is None or not patched.is_file():
        raise CheckError(f"patched wheel not found ({args.patched or 'build/wheels/exllamav3/'}); run "
                         "`overlay apply exllamav3` and carry build/wheels/exllamav3, or pass --patched WHEEL")
    return stock, patched


def install(wheel: Path, target: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CheckError(f"pip could not install {wheel.name} into {target}: {proc.stderr.strip()[-800:]}")


class ArmRunner:
    def __init__(self, name: str, site: Path, work: Path, dry_run: bool) -> None:
        self.name, self.site, self.work, self.dry_run = name, site, work, dry_run
        self.ext_dir = work / f"torch-extensions-{name}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        paths = [str(self.site)] + ([str(STANDIN)] if self.dry_run else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONNOUSERSITE": "1",
               "TORCH_EXTENSIONS_DIR": str(self.ext_dir), "OVERLAY_EXL3_STANDIN": "1" if self.dry_run else "0",
               "EXL3_FUSED_SAMPLER": "0"}
        env.update(extra or {})
        return env

    def python(self, code: str, extra: dict[str, str] | None = None, timeout: float = 3600) -> tuple[float, str]:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=self.env(extra),
                              timeout=timeout, check=False)
        if proc.returncode != 0:
            raise CheckError(f"[{self.name}] python -c failed: {proc.stderr.strip()[-2000:]}")
        return time.perf_counter() - t0, proc.stdout.strip()

    def probe(self, script: str, payload: dict, extra: dict[str, str] | None = None) -> dict:
        proc = subprocess.run([sys.executable, str(PROBES / script)], input=json.dumps(payload), capture_output=True,
                              text=True, env=self.env(extra), timeout=3600, check=False)
        if proc.returncode != 0:
            raise CheckError(f"[{self.name}] {script} failed: {proc.stderr.strip()[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


IMPORT_CODE = (
    "import time; t=time.perf_counter(); import exllamav3; from exllamav3.ext import exllamav3_ext as e; "
    "print(round(time.perf_counter()-t, 3), getattr(e, 'OVERLAY_STANDIN', False))"
)


def check_cold_start(arms: dict[str, ArmRunner]) -> dict:
    out = {}
    for name, arm in arms.items():
        cold_wall, cold = arm.python(IMPORT_CODE)
        warm_wall, warm = arm.python(IMPORT_CODE)
        out[name] = {"cold_import_s": float(cold.split()[0]), "cold_process_s": round(cold_wall, 3),
                     "warm_import_s": float(warm.split()[0]), "warm_process_s": round(warm_wall, 3),
                     "standin": cold.split()[1] == "True"}
    return out


def check_ring(arms: dict[str, ArmRunner], dry_run: bool) -> dict:
    schedules = [
        {"seed": 1, "window": 256, "steps": 150},
        {"seed": 2, "window": 2047, "steps": 120, "bsz": 2, "causal": False},
        {"seed": 3, "window": 100, "steps": 200},
    ]
    mode = {"device": "cpu", "kernels": "reference"} if dry_run else {"device": "cuda", "kernels": "real", "head_dim": 128}
    results = []
    for sched in schedules:
        if dry_run:
            sched = {**sched, "steps": min(sched["steps"], 40), "window": min(sched["window"], 256)}
        stock = arms["stock"].probe("swa_ring.py", {**sched, **mode, "ring": False})
        ring = arms["patched"].probe("swa_ring.py", {**sched, **mode, "ring": True})
        patched_off = arms["patched"].probe("swa_ring.py", {**sched, **mode, "ring": False})
        results.append({
            "schedule": sched, "positions": ring["final_positions"], "kv_state_size": ring["kv_state_size"],
            "ring_equals_stock_bitwise": ring["digests"] == stock["digests"],
            "patched_off_equals_stock_bitwise": patched_off["digests"] == stock["digests"],
            "ring_max_abs_vs_unbounded": ring["max_abs_vs_oracle"],
            "stock_max_abs_vs_unbounded": stock["max_abs_vs_oracle"],
            "stock_shift_clones": stock["clones"], "ring_shift_clones": ring["clones"],
        })
    # Q8 window ring (patch 0009) on the real quantized-cache kernels: error of the attention outputs against the
    # unbounded fp16 history, next to the fp16 ring's (0 on the reference kernels, small on the GPU kernels)
    q8_sched = {"seed": 5, "window": 256, "steps": 40 if dry_run else 120}
    q8 = arms["patched"].probe("swa_ring.py", {**q8_sched, **mode, "ring": True, "quant": [8, 8]})
    fp16 = arms["patched"].probe("swa_ring.py", {**q8_sched, **mode, "ring": True})
    quant = {"schedule": q8_sched, "q8_max_abs_vs_unbounded": q8["max_abs_vs_oracle"],
             "fp16_max_abs_vs_unbounded": fp16["max_abs_vs_oracle"], "q8_state_bytes": q8["state_bytes"],
             "fp16_state_bytes": fp16["state_bytes"]}
    return {"schedules": results, "q8_ring": quant,
            "ok": all(r["ring_equals_stock_bitwise"] and r["patched_off_equals_stock_bitwise"] for r in results)}


def check_drafter_memory(arms: dict[str, ArmRunner], dry_run: bool) -> dict:
    base = {"layer_types": ["sliding_attention"] + ["full_attention"] * 4, "cache_tokens": 384 * 1024,
            "alloc_device": None if dry_run else "cuda"}
    stock = arms["stock"].probe("drafter_model.py", base)
    out = {"stock": {k: stock[k] for k in ("paged_bytes", "ring_bytes", "allocated_bytes")}}
    for w in (2048, 4096):
        forced = arms["patched"].probe("drafter_model.py", {**base, "draft_window": w})
        out[f"patched_draft_window_{w}"] = {k: forced[k] for k in ("paged_bytes", "ring_bytes", "allocated_bytes")}
    return out


def check_drafter_input(arms: dict[str, ArmRunner]) -> dict:
    payload = {"seed": 0, "rounds": 200, "bsz": 1}
    t0 = time.perf_counter()
    stock = arms["stock"].probe("dflash_input.py", payload)
    t1 = time.perf_counter()
    cached = arms["patched"].probe("dflash_input.py", {**payload, "env": {"EXL3_OVL_DFLASH_MASK_CACHE": "1"}})
    t2 = time.perf_counter()
    return {"identical": stock["digests"] == cached["digests"], "embedded_rows": {
        "stock": stock["embedded_rows"], "patched": cached["embedded_rows"]},
        "process_s": {"stock": round(t1 - t0, 3), "patched": round(t2 - t1, 3)}}


def run(args: argparse.Namespace) -> dict:
    if not args.dry_run:
        try:
            import torch
        except ImportError as e:
            raise CheckError("torch is not importable; the device machine needs a CUDA torch build") from e
        if not torch.cuda.is_available():
            raise CheckError("no CUDA device visible (torch.cuda.is_available() is False); use --dry-run on CPU")
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            major, minor = torch.cuda.get_device_capability()
            os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    missing = [m for m in DEPS
               if subprocess.run([sys.executable, "-c", f"import {m}"], capture_output=True, check=False).returncode]
    if missing:
        raise CheckError(f"python modules missing on this machine: {', '.join(missing)} (no network: carry wheels)")
    stock_whl, patched_whl = find_wheels(args)
    work = Path(args.work or tempfile.mkdtemp(prefix="exl3-check-"))
    arms = {}
    for name, wheel in (("stock", stock_whl), ("patched", patched_whl)):
        site = work / f"site-{name}"
        if not (site / "exllamav3").is_dir():
            install(wheel, site)
        arms[name] = ArmRunner(name, site, work, args.dry_run)
    report: dict = {"version": 1, "engine": "exllamav3", "dry_run": args.dry_run,
                    "wheels": {"stock": stock_whl.name, "patched": patched_whl.name}}
    if not args.dry_run:
        import torch
        report["device"] = {"name": torch.cuda.get_device_name(), "torch": torch.__version__,
                            "arch_list": os.environ["TORCH_CUDA_ARCH_LIST"]}
    steps = [("cold_start", lambda: check_cold_start(arms)), ("ring", lambda: check_ring(arms, args.dry_run)),
             ("drafter_memory", lambda: check_drafter_memory(arms, args.dry_run)),
             ("drafter_input", lambda: check_drafter_input(arms))]
    for name, step in steps:
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            report[name] = step()
        except (CheckError, subprocess.TimeoutExpired) as e:
            report[name] = {"error": str(e)}
        report[name]["wall_s"] = round(time.perf_counter() - t0, 2)
        print(f"exllamav3-check: {name}: done in {report[name]['wall_s']} s", file=sys.stderr)
    report["ok"] = all("error" not in report[n] for n, _ in steps if n in report) and \
        report.get("ring", {}).get("ok", True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stock", help="stock wheel (default: build/cache/**/exllamav3-1.6.5-py3-none-any.whl)")
    parser.add_argument("--patched", help="patched wheel (default: newest build/wheels/exllamav3/*.whl)")
    parser.add_argument("--work", help="work folder (default: a new temporary folder)")
    parser.add_argument("--out", help="report file (default: $OUT/exllamav3-device.json or "
                                      "build/reports/exllamav3-device.json)")
    parser.add_argument("--only", nargs="*", help="run only these steps: cold_start ring drafter_memory drafter_input")
    parser.add_argument("--dry-run", action="store_true", help="CPU: extension stand-in, reference kernels")
    args = parser.parse_args(argv)
    try:
        report = run(args)
    except CheckError as e:
        print(f"exllamav3-check: ERROR {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) if os.environ.get("OUT") else
                                             REPO / "build" / "reports") / "exllamav3-device.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)
    print(json.dumps(report, indent=2, sort_keys=True))
    print(f"exllamav3-check: report {out}", file=sys.stderr)
    return 0 if report["ok"] else 4


if __name__ == "__main__":
    raise SystemExit(main())
