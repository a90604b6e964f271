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
- round time: the drafter input path (probes/dflash_input.py) is CPU-side; timings there are reported per arm;
- speculative rounds (probes/spec_round.py): the real Generator round (DFlash-style drafter and target stand-ins
  with a GPU workload per forward) on CUDA tensors and kernels, stock vs patched sync-removal / batched-sampling
  flags: identical tokens, wall time per round (on --dry-run: host syncs per round, counted);
- row-seeded sampling kernels: fused_sampler_rows / gumbel_noise_rows over W rows vs W one-row calls, bit for bit;
- end to end (probes/e2e_generate.py): a tiny HF llama carried along (build/models/llama-target-*) converted to
  EXL3 here with exllamav3's converter, then greedy generation per arm: plain decode, the model as its own draft
  model (K 4, K 7, and K 15 for the 16-row tier of 0016), n-gram drafting; identical tokens stock vs patched
  (flags on; K 15 reported only, 0016 is approximate), time per iteration, tok/s,
  time to first token from process start; with --prebuilt WHEEL (`overlay apply exllamav3 --prebuilt`) also the
  first import and the time to first token without any JIT build.

`--dry-run` runs the same harness on CPU with the extension stand-in (test infrastructure), reference kernels and
meta-only memory, so the script itself is exercised where there is no GPU; steps that need the CUDA kernels
(sampler kernels, conversion and generation) report what they would run. The JSON report is written atomically.
`--shared-ext` builds the extension once (patched tree) and gives the same compiled module to both arms: the
patched C++ is a superset whose defaults reproduce stock (0015, 0016), and one JIT build of ~200 units is what a
short device budget allows.
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
STANDIN = REPO / "support" / "testbackends" / "exllamav3" / "pythonpath"
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


def share_extension(arms: dict[str, ArmRunner], work: Path) -> dict:
    """Copy the patched arm's JIT-built exllamav3_ext into both sites as a top-level precompiled module"""
    import sysconfig

    built = sorted(arms["patched"].ext_dir.rglob("exllamav3_ext*.so"))
    if not built:
        raise CheckError(f"no compiled exllamav3_ext under {arms['patched'].ext_dir} (run the cold_start step first)")
    name = "exllamav3_ext" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")
    for arm in arms.values():
        (arm.site / name).write_bytes(built[-1].read_bytes())
    return {"extension": str(built[-1]), "installed_as": name}


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


SPEC_FLAGS = {
    "event": {"EXL3_OVL_EVENT_SYNC": "1"},
    "readback": {"EXL3_OVL_VERIFY_READBACK": "1", "EXL3_OVL_EVENT_SYNC": "1"},
    "round": {"EXL3_OVL_ROUND_SYNC": "1", "EXL3_OVL_EVENT_SYNC": "1"},
    "all": {"EXL3_OVL_ROUND_SYNC": "1", "EXL3_OVL_EVENT_SYNC": "1", "EXL3_OVL_BATCH_SAMPLE": "1"},
}
E2E_FLAGS = {"EXL3_OVL_EVENT_SYNC": "1", "EXL3_OVL_VERIFY_READBACK": "1", "EXL3_OVL_ROUND_SYNC": "1",
             "EXL3_OVL_BATCH_SAMPLE": "1", "EXL3_OVL_BSZN": "16"}
OUTPUT_KEYS = ("tokens", "results", "accepted", "rejected", "pages", "kv_positions", "rng", "kv_updates")


def check_spec_rounds(arms: dict[str, ArmRunner], dry_run: bool) -> dict:
    cases = {
        "bsz1-k7": {"seed": 1, "bsz": 1, "rounds": 40, "corrupt": 10},
        "bsz4-k7": {"seed": 2, "bsz": 4, "rounds": 40, "corrupt": 10},
        "bsz4-k7-temp": {"seed": 3, "bsz": 4, "rounds": 40, "corrupt": 10, "sampler": "temp"},
    }
    extra = {} if dry_run else {"device": "cuda", "work": 20}
    out: dict = {}
    for name, case in cases.items():
        payload = {**case, **extra, "rounds": 8 if dry_run else case["rounds"]}
        stock = arms["stock"].probe("spec_round.py", payload)
        row: dict = {"stock": _round_summary(stock, dry_run)}
        for flag, env in SPEC_FLAGS.items():
            patched = arms["patched"].probe("spec_round.py", {**payload, "env": env})
            row[flag] = {**_round_summary(patched, dry_run),
                         "identical": all(patched[k] == stock[k] for k in OUTPUT_KEYS)}
            if not dry_run and stock["rounds_s"]:
                row[flag]["round_time_ratio"] = round(patched["rounds_s"] / stock["rounds_s"], 3)
        out[name] = row
    out["ok"] = all(v["identical"] for row in out.values() if isinstance(row, dict)
                    for k, v in row.items() if k != "stock")
    return out


def _round_summary(doc: dict, dry_run: bool) -> dict:
    spec = [r for r in doc["per_round"] if r["kind"] == "spec"]
    summary = {"rounds": len(spec), "accepted": sum(sum(r) for r in doc["accepted"])}
    if dry_run:
        summary["host_syncs_per_round"] = round(sum(r["syncs"] for r in spec) / max(len(spec), 1), 2)
    else:
        summary["ms_per_round"] = round(1000 * doc["rounds_s"] / max(len(spec), 1), 3)
    return summary


SAMPLER_KERNEL_CODE = r"""
import json, torch
from exllamav3.ext import exllamav3_ext as ext
torch.manual_seed(0)
out = {}
for W, V, dtype in ((8, 512, torch.half), (16, 32000, torch.float), (12, 151936, torch.half)):
    logits = (torch.randn((W, V), device="cuda") * 4).to(dtype)
    seeds = [int(s) for s in torch.randint(0, 2**32 - 1, (W,))]
    res = {}
    for mode in (0, 1, 2):
        ws = torch.empty((W * ext.FUSED_SAMPLER_MAX_BLOCKS * 3,), dtype=torch.float, device="cuda")
        rows = torch.empty((W, 1), dtype=torch.long, device="cuda")
        ext.fused_sampler_rows(logits, None, None, rows, ws, V, 1 / 0.8, -2.0, seeds, mode, 0, 0, 1.0, 1.0, None)
        serial = []
        for i in range(W):
            one = torch.empty((1, 1), dtype=torch.long, device="cuda")
            ws1 = torch.empty((ext.FUSED_SAMPLER_MAX_BLOCKS * 3,), dtype=torch.float, device="cuda")
            ext.fused_sampler(logits[i:i + 1].contiguous(), None, None, one, ws1, V, 1 / 0.8, -2.0, seeds[i], mode,
                              0, 0, 1.0, 1.0, None)
            serial.append(one)
        res[f"fused_mode{mode}"] = bool(torch.equal(rows, torch.cat(serial)))
    x = logits.float().contiguous()
    batched = torch.empty_like(x)
    ext.gumbel_noise_rows(x, batched, seeds, 1)
    serial = torch.empty_like(x)
    for i in range(W):
        row = torch.empty_like(x[i:i + 1])
        ext.gumbel_noise_f32(x[i:i + 1].contiguous(), row, seeds[i])
        serial[i:i + 1].copy_(row)
    res["gumbel_f32_bitwise"] = bool(torch.equal(batched, serial))
    out[f"W{W}-V{V}-{str(dtype).split('.')[-1]}"] = res
print(json.dumps(out))
"""


def check_sampler_kernels(arms: dict[str, ArmRunner], dry_run: bool) -> dict:
    if dry_run:
        return {"skipped": "the row-seeded sampling kernels need the CUDA extension"}
    _, text = arms["patched"].python(SAMPLER_KERNEL_CODE)
    result = json.loads(text.splitlines()[-1])
    return {"shapes": result, "ok": all(all(v.values()) for v in result.values())}


def _tiny_model(pattern: str) -> Path | None:
    found = sorted((REPO / "build" / "models").glob(pattern))
    return found[-1] if found else None


def convert(arm: ArmRunner, hf_dir: Path, out_dir: Path, work: Path) -> dict:
    if (out_dir / "config.json").is_file():
        return {"cached": True}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "exllamav3.conversion.convert_model", "-i", str(hf_dir), "-o", str(out_dir), "-w",
         str(work), "-b", "4.0", "-hb", "6", "-cr", "16", "-cc", "256"],
        capture_output=True, text=True, env=arm.env(), timeout=3600, check=False)
    if proc.returncode != 0:
        raise CheckError(f"EXL3 conversion of {hf_dir.name} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
    return {"cached": False, "seconds": round(time.perf_counter() - t0, 1)}


E2E_PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    '{"id": 17, "name": "widget", "tags": ["a", "b"], "price": 3.5}, {"id": 18, "name": ',
    "SELECT name, price FROM products WHERE price > 10 ORDER BY",
]


def check_e2e(arms: dict[str, ArmRunner], dry_run: bool, work: Path, prebuilt: ArmRunner | None) -> dict:
    hf = _tiny_model("llama-target-*")
    if hf is None:
        return {"error": "build/models/llama-target-* not found: build it (overlay models build "
                         "llama-target) and carry it along"}
    info: dict = {"model": hf.name}
    if dry_run:
        info["skipped"] = "EXL3 conversion and generation need the CUDA extension"
        return info
    exl3 = work / f"{hf.name}-exl3"
    info["conversion"] = convert(arms["patched"], hf, exl3, work / "convert-work")
    modes = {
        "plain": {},
        "self-draft-k4": {"draft_model": str(exl3), "num_draft_tokens": 4},
        "self-draft-k7": {"draft_model": str(exl3), "num_draft_tokens": 7},
        "self-draft-k15": {"draft_model": str(exl3), "num_draft_tokens": 15},
        "ngram": {"ngram": 2, "num_draft_tokens": 4},
    }
    # K 15 verifies 16 rows: with EXL3_OVL_BSZN=16 they take the fused tier stock runs eagerly (0016, approximate),
    # so its identity is reported, not required
    approximate = {"self-draft-k15"}
    cases = [{"model": str(exl3), "prompts": E2E_PROMPTS, "max_new_tokens": 96, **m} for m in modes.values()]
    stock = run_cases_on(arms["stock"], cases)
    patched_off = run_cases_on(arms["patched"], cases)
    patched_on = run_cases_on(arms["patched"], [{**c, "env": E2E_FLAGS} for c in cases])
    rows = {}
    for name, s, off, on in zip(modes, stock, patched_off, patched_on):
        rows[name] = {
            "identical_off": s["tokens"] == off["tokens"], "identical_on": s["tokens"] == on["tokens"],
            "generated": s["generated"], "accepted": [s["accepted"], on["accepted"]],
            "iterate_ms": {"stock": s["iterate_ms"], "patched_off": off["iterate_ms"], "patched_on": on["iterate_ms"]},
            "tok_s": {"stock": s["tok_s"], "patched_on": on["tok_s"]},
            "ttft_process_s": {"stock": s["ttft_process_s"], "patched_on": on["ttft_process_s"]},
        }
    info["modes"] = rows
    if prebuilt is not None:
        # time to first token from process start, with the extension shipped in the wheel (no JIT)
        first = run_cases_on(prebuilt, [{**cases[0], "prompts": E2E_PROMPTS[:1], "max_new_tokens": 8}])[0]
        info["ttft_prebuilt_process_s"] = first["ttft_process_s"]
    info["ok"] = all(r["identical_off"] and (r["identical_on"] or name in approximate) for name, r in rows.items())
    return info


def run_cases_on(arm: ArmRunner, cases: list[dict]) -> list[dict]:
    return list(arm.probe("e2e_generate.py", {"cases": cases})["cases"])


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
    prebuilt = None
    if args.prebuilt:
        site = work / "site-prebuilt"
        if not (site / "exllamav3").is_dir():
            install(Path(args.prebuilt), site)
        prebuilt = ArmRunner("prebuilt", site, work, args.dry_run)
    report: dict = {"version": 1, "engine": "exllamav3", "dry_run": args.dry_run,
                    "wheels": {"stock": stock_whl.name, "patched": patched_whl.name,
                               "prebuilt": Path(args.prebuilt).name if args.prebuilt else None}}
    if not args.dry_run:
        import torch
        report["device"] = {"name": torch.cuda.get_device_name(), "torch": torch.__version__,
                            "arch_list": os.environ["TORCH_CUDA_ARCH_LIST"]}
    cold_arms = dict(arms, **({"prebuilt": prebuilt} if prebuilt is not None else {}))
    steps = [("cold_start", lambda: check_cold_start(cold_arms)),
             ("shared_ext", lambda: share_extension(arms, work) if args.shared_ext else {"skipped": "not asked"}),
             ("ring", lambda: check_ring(arms, args.dry_run)),
             ("drafter_memory", lambda: check_drafter_memory(arms, args.dry_run)),
             ("drafter_input", lambda: check_drafter_input(arms)),
             ("spec_rounds", lambda: check_spec_rounds(arms, args.dry_run)),
             ("sampler_kernels", lambda: check_sampler_kernels(arms, args.dry_run)),
             ("e2e", lambda: check_e2e(arms, args.dry_run, work, prebuilt))]
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
    report["ok"] = all("error" not in report[n] and report[n].get("ok", True) for n, _ in steps if n in report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stock", help="stock wheel (default: build/cache/**/exllamav3-1.6.5-py3-none-any.whl)")
    parser.add_argument("--patched", help="patched wheel (default: newest build/wheels/exllamav3/*.whl)")
    parser.add_argument("--work", help="work folder (default: a new temporary folder)")
    parser.add_argument("--out", help="report file (default: $OUT/exllamav3-device.json or "
                                      "build/reports/exllamav3-device.json)")
    parser.add_argument("--only", nargs="*", help="run only these steps: cold_start shared_ext ring drafter_memory "
                                                  "drafter_input spec_rounds sampler_kernels e2e")
    parser.add_argument("--prebuilt", help="a wheel from `overlay apply exllamav3 --prebuilt` (compiled extension "
                                           "inside): cold import and time to first token without a JIT build")
    parser.add_argument("--shared-ext", action="store_true",
                        help="after the cold start, give the patched arm's compiled extension to the stock arm too "
                             "(one JIT build instead of two)")
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
