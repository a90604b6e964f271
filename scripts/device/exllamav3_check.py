#!/usr/bin/env python3
"""ExLlamaV3 device census on an NVIDIA GPU machine with no network: the census metrics and time of the wheel's own
code, stock vs patched flag off vs patched flag on, plus the correctness checks only a GPU can make.

Phases (``--phase``; the driver, scripts/device_check.py, runs ``build`` in the background while SGLang measures, then
``probes``; ``all`` does both):

- ``build``: the extension for both arms from one source folder, so the patched arm recompiles only what the series
  changes. The stock tree's ``exllamav3_ext`` sources and ``cuda_flags.py`` are copied to ``WORK/ext-tree`` and built
  there (scripts/build_exllamav3_ext.py: upstream's recipe, torch's ninja build, ``WORK/ext-build``); then the files
  the series changes are written over them and the same build folder is built again: ninja recompiles the changed
  translation units and those including a changed header (17 of 194 for the 22-patch series), and relinks. Each arm
  gets its ``.so`` as the precompiled top-level ``exllamav3_ext`` module at its site root
  (``ext.is_precompiled_extension_available()``), so stock runs stock C++ and patched runs the patched C++ in its
  default path (no shared extension), and a key of what it was built from (``build_key``): a later call on the warm
  machine skips an arm whose key is unchanged. A build stopped by its budget keeps its ninja folder: the next call
  continues it. The report records the units changed, the units ninja recompiled, the seconds of each build and the
  plan's estimates (scripts/device/plan.py: calibrated on the development VM, not measured on a GPU machine).
- ``probes``: the plan's ExLlamaV3 probes (scripts/device/plan.py; the patches' flags from the driver's resolved plan),
  each configuration in its own process (scripts/device/exl3_probe.py), visited twice in ABBA order (counted and
  timed on the first visit, timed again on the second); then, while the budget lasts, the correctness checks only
  real kernels can make: the ring checks (``ring_cases``: a drafter with its own sliding layer next to a
  ``--draft_window`` layer, ring and linear, and a SharedKVAttention drafter layer reading the target's ring, against
  their unbounded references on upstream's Triton decode kernel, with the graphed decode step left on and counted) and
  the row-seeded sampler kernels (bit for bit against one-row calls). ``--resume`` carries over what an earlier call
  on this machine measured ok (its report in ``WORK/last-report.json``, same wheels): the device session's second call
  (plan.exl3_schedule) runs only what the first left.

``--dry-run`` runs the same phases on CPU: the build phase computes the changed and dependent units and skips the
compiler (no nvcc, CPU torch), the probes run with the extension stand-in and the CPU census; the report has the same
shape. Output: ``--out`` (default ``$OUT/exllamav3-device.json``), written atomically; exit 0, 4 when a check fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src" / "overlay" / "engines" / "workers"))

sys.path.insert(0, str(REPO / "scripts"))

import cuda_census
import plan
from build_exllamav3_ext import changed_files, dependent_units

__all__ = ["changed_files", "dependent_units"]  # the build script's: the tests read them here too

PROBES = REPO / "tests" / "engines" / "exllamav3" / "probes"
STANDIN = REPO / "support" / "testbackends" / "exllamav3" / "pythonpath"
DEPS = [
    "torch",
    "triton",
    "numpy",
    "safetensors",
    "tokenizers",
    "pydantic",
    "marisa_trie",
    "rich",
    "yaml",
    "PIL",
]
EXT = "exllamav3_ext"
SOURCE_SUFFIXES = (".c", ".cpp", ".cu")
TIMED = ("spec-round", "swa-ring")  # the probes whose time per step is reported


class CheckError(RuntimeError):
    pass


def find_wheels(args: argparse.Namespace) -> tuple[Path, Path]:
    stock = (
        Path(args.stock)
        if args.stock
        else next(iter(sorted((REPO / "build" / "cache").rglob("exllamav3-1.6.5-py3-none-any.whl"))), None)
    )
    patched = (
        Path(args.patched)
        if args.patched
        else next(
            iter(
                sorted(
                    (REPO / "build" / "wheels" / "exllamav3").glob("exllamav3-1.6.5+ovl*.whl"),
                    key=lambda p: p.stat().st_mtime,
                    reverse=True,
                )
            ),
            None,
        )
    )
    if stock is None or not stock.is_file():
        raise CheckError(
            f"stock wheel not found ({args.stock or 'build/cache/**/exllamav3-1.6.5-py3-none-any.whl'}); "
            "run `overlay fetch exllamav3` and carry build/cache, or pass --stock WHEEL"
        )
    if patched is None or not patched.is_file():
        raise CheckError(
            f"patched wheel not found ({args.patched or 'build/wheels/exllamav3/'}); run "
            "`overlay apply exllamav3` and carry build/wheels/exllamav3, or pass --patched WHEEL"
        )
    return stock, patched


def install(wheel: Path, target: Path) -> None:
    marker = target / ".overlay-wheel"
    if marker.is_file() and marker.read_text() == wheel.name:
        return
    shutil.rmtree(target, ignore_errors=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise CheckError(f"pip could not install {wheel.name} into {target}: {proc.stderr.strip()[-800:]}")
    marker.write_text(wheel.name)


class ArmRunner:
    def __init__(self, name: str, site: Path, work: Path, dry_run: bool) -> None:
        self.name, self.site, self.work, self.dry_run = name, site, work, dry_run

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        paths = [str(self.site)] + ([str(STANDIN)] if self.dry_run else [])
        env = {k: v for k, v in os.environ.items() if not k.startswith("EXL3_OVL_")}
        env.update(
            {
                "PYTHONPATH": os.pathsep.join(paths),
                "PYTHONNOUSERSITE": "1",
                "TORCH_EXTENSIONS_DIR": str(self.work / f"torch-extensions-{self.name}"),
                "OVERLAY_EXL3_STANDIN": "1" if self.dry_run else "0",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.dry_run:
            env["EXL3_FUSED_SAMPLER"] = "0"  # the CPU stand-in has no fused sampler kernels
        else:
            env["EXL3_FUSED_SAMPLER"] = "1"  # upstream's default: never forced off on the GPU
        env.update(extra or {})
        return env

    def run(
        self, script: Path, payload: dict[str, Any], extra: dict[str, str] | None = None, timeout: float = 600
    ) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, str(script)],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            env=self.env(extra),
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise CheckError(f"[{self.name}] {script.name} failed: {proc.stderr.strip()[-1500:]}")
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --- build phase ----------------------------------------------------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _flags(tree: Path) -> list[str] | None:
    import importlib.util

    path = tree / "exllamav3" / "util" / "cuda_flags.py"
    spec = importlib.util.spec_from_file_location(f"_ovl_cuda_flags_{abs(hash(str(tree)))}", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        flags = list(module.cuda_cflags())
        defines = getattr(module, "ovl_build_defines", None)
        return flags + (list(defines()) if defines else [])
    except Exception:
        return None


def _build(tree: Path, out: Path, build_dir: Path, jobs: int, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    started = time.time()
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "build_exllamav3_ext.py"),
        "--tree",
        str(tree),
        "--out",
        str(out),
        "--build-dir",
        str(build_dir),
        "--jobs",
        str(jobs),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "seconds": round(time.monotonic() - t0, 1),
            "error": f"over its budget of {int(timeout)} s (the build folder is kept: a rerun continues it)",
        }
    objects = list(build_dir.glob("*.o")) + list(build_dir.rglob("*.cuda.o"))
    rebuilt = sorted({p.name for p in objects if p.stat().st_mtime >= started - 1})
    result = {
        "ok": proc.returncode == 0,
        "seconds": round(time.monotonic() - t0, 1),
        "objects_recompiled": len(rebuilt),
        "objects": len({p.name for p in objects}),
    }
    if proc.returncode != 0:
        result["error"] = (proc.stderr or proc.stdout).strip()[-1500:]
    return result


def build_phase(
    sites: dict[str, Path], work: Path, *, dry_run: bool, jobs: int, deadline: plan.Deadline
) -> dict:
    stock_src = sites["stock"] / "exllamav3" / EXT
    patched_src = sites["patched"] / "exllamav3" / EXT
    diff = changed_files(stock_src, patched_src)
    touched = set(diff["added"]) | set(diff["changed"])
    units = dependent_units(patched_src, touched)
    all_units = sorted(
        p.relative_to(stock_src).as_posix()
        for p in stock_src.rglob("*")
        if p.suffix in SOURCE_SUFFIXES and "rocm" not in p.parts
    )
    stock_tree, patched_tree = sites["stock"], sites["patched"]
    same_flags = (stock_tree / "exllamav3/util/cuda_flags.py").read_bytes() == (
        patched_tree / "exllamav3/util/cuda_flags.py"
    ).read_bytes()
    if not same_flags:
        fs, fp = _flags(stock_tree), _flags(patched_tree)
        same_flags = fs is not None and fs == fp
    report: dict[str, Any] = {
        "units": len(all_units),
        "files_changed": diff,
        "units_to_rebuild": units,
        "same_nvcc_flags": same_flags,
    }
    if dry_run:
        report["skipped"] = (
            "dry run: no nvcc and CPU torch; the stand-in extension serves both arms (on the GPU: "
            f"stock {len(all_units)} units, then {len(units)} for the patched arm)"
        )
        return report
    report["estimate_s"] = {"stock": plan.EXL3_STOCK_BUILD_S, "patched": plan.EXL3_PATCHED_BUILD_S}
    tree = work / "ext-tree"
    build_dir = work / "ext-build"
    build_dir.mkdir(parents=True, exist_ok=True)
    keys = {arm: build_key(sites[arm]) for arm in ("stock", "patched")}
    for arm, src in (("stock", stock_src), ("patched", patched_src)):
        if extension_ready(sites[arm]) and _read(sites[arm] / BUILT_MARKER) == keys[arm]:
            # built by an earlier call on this (warm) machine from the same sources, flags and torch
            report[arm] = {"ok": True, "up_to_date": True, "seconds": 0.0}
            continue
        # the fixed source folder, this arm's content (files only rewritten when they differ: ninja sees no change
        # otherwise, so the patched arm recompiles only the changed units and their includers)
        flags = sites[arm] / "exllamav3/util/cuda_flags.py"
        _sync_tree(src, tree / "exllamav3" / EXT, flags, tree)
        report[arm] = _build(tree, sites[arm], build_dir, jobs, max(30.0, deadline.left() - 5))
        if not report[arm]["ok"]:
            if arm == "stock":
                report["patched"] = {"ok": False, "error": "not built: the stock build did not finish"}
            return report
        (sites[arm] / BUILT_MARKER).write_text(keys[arm])
    return report


BUILT_MARKER = ".overlay-ext-key"


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def build_key(site: Path) -> str:
    """What an arm's extension is built from: its extension sources, its util/cuda_flags.py and build defines, the
    architectures and the torch build (a warm machine's second call skips an arm whose key is unchanged)."""
    h = hashlib.sha256()
    src = site / "exllamav3" / EXT
    for path in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(src).as_posix().encode() + b"\0" + _digest(path).encode() + b"\0")
    flags = site / "exllamav3" / "util" / "cuda_flags.py"
    h.update(_digest(flags).encode() if flags.is_file() else b"-")
    h.update(json.dumps(_flags(site)).encode())
    h.update(os.environ.get("TORCH_CUDA_ARCH_LIST", "").encode())
    try:
        import torch

        h.update(f"{torch.__version__} {torch.version.cuda}".encode())
    except ImportError:
        h.update(b"no torch")
    return h.hexdigest()


def _sync_tree(src: Path, dst: Path, flags: Path, tree: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    wanted = {
        p.relative_to(src).as_posix(): p
        for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    for rel in [p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()]:
        if rel not in wanted:
            (dst / rel).unlink()
    for rel, path in wanted.items():
        target = dst / rel
        if not target.is_file() or _digest(target) != _digest(path):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    util = tree / "exllamav3" / "util"
    util.mkdir(parents=True, exist_ok=True)
    if not (util / "cuda_flags.py").is_file() or _digest(util / "cuda_flags.py") != _digest(flags):
        shutil.copyfile(flags, util / "cuda_flags.py")


LAST_REPORT = "last-report.json"


def _last_report(work: Path, wheels: dict[str, str]) -> dict[str, Any]:
    """The earlier call's report on this machine, when it measured the same two wheels (else nothing carries)."""
    path = work / LAST_REPORT
    try:
        doc = dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}
    return doc if doc.get("wheels") == wheels else {}


def extension_ready(site: Path) -> bool:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return (site / f"{EXT}{suffix}").is_file()


# --- probes phase ---------------------------------------------------------------------------------------------------


def _options(entry: dict[str, Any]) -> dict[str, Any]:
    return dict(entry.get("options") or {})


def request_for(key: str, config: str, entry: dict[str, Any] | None, dry: bool) -> dict[str, Any]:
    """The exl3_probe request of one configuration of a probe ("stock", "flag_off" or "patched")."""
    on = config == "patched"
    if key == "spec-round":
        # the loader keeps the target's embedding on the host unless --embed_on_device (issue 15) asks otherwise
        embed = "device" if on and "--embed_on_device" in _options(entry or {}) else "host"
        return {
            "mode": "spec",
            "dry_run": dry,
            "steps": 3,
            "bsz": 2,
            "block": 8,
            "embed": embed,
            "time_rounds": 6 if dry else 20,
        }
    if key in ("swa-ring", "swa-ring-q8"):
        payload: dict[str, Any] = {
            "seed": 1,
            "window": 64 if dry else 256,
            "steps": 8 if dry else 150,
            "bsz": 1,
            "ring": on,
            "causal": True,
        }
        payload.update(
            {"device": "cpu", "kernels": "reference"}
            if dry
            else {"device": "cuda", "kernels": "real", "head_dim": 128}
        )
        if key == "swa-ring-q8" and on:
            payload["quant"] = [8, 8]
        return {
            "mode": "script",
            "dry_run": dry,
            "probe": "swa_ring.py",
            "payload": payload,
            # the Q8 ring's mechanism is the rings' device bytes (drafter-load on CPU); here they are held through the
            # decode steps, so the steps' peak shows them
            "tag": "drafter-load" if key == "swa-ring-q8" else "draft-round",
            "steps": ["exllamav3.modules.sliding_attn:SlidingAttention.decode_flash_attn"],
            "capture": key == "swa-ring",
        }
    if key == "drafter-memory":
        payload = {
            "layer_types": ["sliding_attention"] + ["full_attention"] * 4,
            "cache_tokens": 384 * 1024,
            "alloc_device": None if dry else "cuda",
        }
        window = _options(entry or {}).get("--draft_window") if on else None
        if window:
            payload["draft_window"] = int(window)
        return {
            "mode": "script",
            "dry_run": dry,
            "probe": "drafter_model.py",
            "payload": payload,
            "tag": "drafter-load",
            "steps": [],
            "time": False,
        }
    raise CheckError(f"no request for probe {key!r}")


def probes_phase(
    arms: dict[str, ArmRunner],
    entries: list[dict[str, Any]],
    *,
    dry: bool,
    deadline: plan.Deadline,
    done: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The plan's probes while the budget lasts; ``done`` (--resume): measurements of an earlier call on this machine
    that ran ok, carried over instead of run again."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        if e["engine"] == "exllamav3":
            by_key.setdefault(e["key"], []).append(e)
    done = done or {}
    out = []
    for planned in plan.budget_plan("exllamav3", deadline.left(), keys=(set(by_key) - set(done)) or None):
        key = planned.probe.key
        if key in done:
            out.append({**done[key], "carried": True})
            print(f"exllamav3-check: {key}: ok (carried from the earlier call)", file=sys.stderr, flush=True)
            continue
        group = [
            e for e in by_key.get(key) or [] if not e.get("pending")
        ]  # pending ones are reported, not run
        m: dict[str, Any] = {
            "key": key,
            "region": planned.probe.region,
            "status": "ok",
            "reason": None,
            "patches": sorted({e["patch"] for e in group}),
            "scenarios": sorted({e["scenario"] for e in group}),
        }
        if not by_key.get(key):
            m.update(status="skipped", reason="no patch of the series as it is matches this probe")
        elif not planned.run or not group:
            m.update(status="skipped", reason=planned.reason or "pending: every mechanism of it is pending")
        elif not deadline.allows(planned.probe.seconds):
            m.update(
                status="skipped",
                reason=f"over budget: ~{planned.probe.seconds} s needed, {int(deadline.left())} s left",
            )
        else:
            t0 = time.monotonic()
            try:
                m["by_scenario"] = run_configs(arms, key, group, dry, deadline)
            except (CheckError, subprocess.TimeoutExpired) as exc:
                m.update(status="failed", reason=str(exc)[:1500])
            m["wall_s"] = round(time.monotonic() - t0, 2)
        out.append(m)
        print(
            f"exllamav3-check: {key}: {m['status']}{' (' + str(m['reason'])[:200] + ')' if m['reason'] else ''}",
            file=sys.stderr,
            flush=True,
        )
    return out


def _comparable(doc: dict[str, Any]) -> Any:
    """What must be identical across configurations: the attention outputs' digests of a ring probe, the tokens and
    acceptance of a speculative run, the cache geometry aside (a drafter-memory probe compares nothing)."""
    outputs = doc.get("outputs")
    if isinstance(outputs, dict) and "digests" in outputs:
        return outputs["digests"]
    if isinstance(outputs, dict) and "tokens" in outputs:
        return outputs
    return None


def run_configs(
    arms: dict[str, ArmRunner], key: str, group: list[dict[str, Any]], dry: bool, deadline: plan.Deadline
) -> dict[str, Any]:
    """Every configuration of one probe, twice in ABBA order; per scenario: configs {name: {report, error}}, equal,
    time."""
    configs: dict[str, tuple[ArmRunner, dict[str, str], dict[str, Any] | None]] = {
        "stock": (arms["stock"], {}, None),
        "flag_off": (arms["patched"], {}, None),
    }
    for e in group:
        name = "patched:" + e["flag"]
        if name not in configs:
            configs[name] = (arms["patched"], dict(e.get("env") or {}), e)
    docs: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in configs}
    visits = (
        2 if key in TIMED and not dry else 1
    )  # memory probes counted once; timed ones visited twice, ABBA
    for name in cuda_census.interleave(list(configs), visits):
        arm, env, entry = configs[name]
        kind = "patched" if name.startswith("patched:") else name
        if deadline.left() < 5:
            errors.setdefault(name, "over budget: the probe's time ran out before this configuration")
            continue
        try:  # one configuration's process may not outlive what is left of the budget
            doc = arm.run(
                HERE / "exl3_probe.py",
                request_for(key, kind, entry, dry),
                env,
                timeout=max(5.0, min(600.0, deadline.left())),
            )
        except subprocess.TimeoutExpired:
            errors[name] = "over budget: the configuration's process ran past the budget and was stopped"
            continue
        except CheckError as exc:
            errors[name] = str(exc)
            continue
        docs.setdefault(name, doc)
        for tag, values in (doc.get("time") or {}).items():
            samples[name].setdefault(tag, []).extend(values)
    by_scenario: dict[str, Any] = {}
    for scenario in sorted({e["scenario"] for e in group}):
        rows = {}
        for name in configs:
            doc = docs.get(name)
            rows[name] = {
                "report": (doc.get("reports") or {}).get(scenario) if doc else None,
                "error": errors.get(name) if doc is None else None,
                "flags_read": doc.get("flags_read") if doc else None,
            }
            env = configs[name][1]
            unread = sorted(k for k in env if doc is not None and k not in (doc.get("flags_read") or []))
            if unread and rows[name]["report"] is not None:
                rows[name]["error"] = (
                    f"{', '.join(unread)} set but never read in this region: the patch's code did "
                    "not run here"
                )
                rows[name]["report"] = None
        equal = {}
        for name in configs:
            if name.startswith("patched:") and name in docs and "flag_off" in docs:
                equal[f"flag_off_vs_{name}"] = _comparable(docs[name]) == _comparable(docs["flag_off"])
        if "stock" in docs and "flag_off" in docs:
            equal["stock_vs_flag_off"] = _comparable(docs["stock"]) == _comparable(docs["flag_off"])
        timing = {}
        for name in configs:
            if name.startswith("patched:"):
                timing[f"flag_off_vs_{name}"] = cuda_census.ratio_interval(
                    samples["flag_off"].get(scenario, []), samples[name].get(scenario, [])
                )
                timing[f"stock_vs_{name}"] = cuda_census.ratio_interval(
                    samples["stock"].get(scenario, []), samples[name].get(scenario, [])
                )
        by_scenario[scenario] = {"configs": rows, "equal": equal, "time": timing}
    return by_scenario


# --- GPU-only correctness checks -------------------------------------------------------------------------------------

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


def check_sampler_kernels(arm: ArmRunner, dry: bool) -> dict[str, Any]:
    if dry:
        return {"skipped": "the row-seeded sampling kernels need the CUDA extension"}
    proc = subprocess.run(
        [sys.executable, "-c", SAMPLER_KERNEL_CODE],
        capture_output=True,
        text=True,
        env=arm.env(),
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-1500:]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"shapes": result, "ok": all(all(v.values()) for v in result.values())}


def ring_cases(dry: bool) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The ring correctness cases: (name, arm, probe, payload). On the GPU with upstream's Triton decode kernel and
    the graphed decode step left on (the probes count how many steps it served: their layers have no EXL3
    projections, so it declines and says so); on the dry run with the probes' reference kernels."""
    where: dict[str, Any] = (
        {"device": "cpu", "kernels": "reference"}
        if dry
        else {"device": "cuda", "kernels": "real", "graphed": True}
    )
    mixed = {
        "seed": 5,
        "layer_types": ["sliding_attention", "full_attention"],
        "window": 256,
        "draft_window": 1024,
        "steps": 12 if dry else 150,
        "big": [1500],
        **where,
    }
    control = {**mixed, "layer_types": ["sliding_attention", "sliding_attention"], "draft_window": None}
    shared = {"seed": 2, "steps": 40 if dry else 900, "window": 256, **where}
    return [
        # F1: a drafter with its own sliding layer next to a --draft_window layer (0001), ring and linear
        ("mixed-control-stock", "stock", "mixed_ring.py", control),
        ("mixed-control-ring", "patched", "mixed_ring.py", {**control, "ring": True}),
        ("mixed-linear", "patched", "mixed_ring.py", mixed),
        ("mixed-ring", "patched", "mixed_ring.py", {**mixed, "ring": True}),
        # F2: a SharedKVAttention drafter layer reading the target's ring in a later forward (0002)
        ("shared-kv-stock", "stock", "shared_kv_ring.py", shared),
        ("shared-kv-linear", "patched", "shared_kv_ring.py", shared),
        ("shared-kv-ring", "patched", "shared_kv_ring.py", {**shared, "ring": True}),
    ]


def check_rings(arms: dict[str, ArmRunner], dry: bool, deadline: plan.Deadline) -> dict[str, Any]:
    """Mixed window rings and SharedKVAttention over a ring against their unbounded references (every output), plus
    ring vs linear and stock vs patched where both exist: 0 mismatches (within the kernels' tolerance on the GPU) and
    no crash."""
    out: dict[str, Any] = {"cases": {}}
    for name, arm, script, payload in ring_cases(dry):
        if deadline.left() < 20:
            out["cases"][name] = {"skipped": "over budget"}
            continue
        try:
            out["cases"][name] = arms[arm].run(
                PROBES / script, payload, timeout=max(10.0, min(300.0, deadline.left() - 5))
            )
        except (CheckError, subprocess.TimeoutExpired) as exc:
            out["cases"][name] = {"error": str(exc)[:1500]}
    cases = out["cases"]

    def clean(doc: dict[str, Any]) -> bool:
        bad = doc.get("mismatches")
        return (
            "error" not in doc
            and "skipped" not in doc
            and not doc.get("errors")
            and (sum(bad) if isinstance(bad, list) else bad) == 0
        )

    ran = {k: v for k, v in cases.items() if "skipped" not in v}
    out["clean"] = {k: clean(v) for k, v in ran.items()}
    same = {}
    if "mixed-control-stock" in ran and "mixed-control-ring" in ran:
        same["mixed_control_stock_vs_ring"] = ran["mixed-control-stock"].get("digests") == ran[
            "mixed-control-ring"
        ].get("digests")
    if "mixed-linear" in ran and "mixed-ring" in ran:
        same["mixed_linear_vs_ring"] = ran["mixed-linear"].get("digests") == ran["mixed-ring"].get("digests")
    out["equal"] = same
    out["graphed_steps"] = {k: v.get("graphed_steps") for k, v in ran.items()}
    out["ok"] = bool(ran) and all(out["clean"].values()) and all(same.values())
    return out


# --- driver ---------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    deadline = plan.Deadline(args.budget)
    if not args.dry_run:
        try:
            import torch
        except ImportError as e:
            raise CheckError("torch is not importable; the device machine needs a CUDA torch build") from e
        if not torch.cuda.is_available():
            raise CheckError(
                "no CUDA device visible (torch.cuda.is_available() is False); use --dry-run on CPU"
            )
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            major, minor = torch.cuda.get_device_capability()
            os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    missing = [
        m
        for m in DEPS
        if subprocess.run([sys.executable, "-c", f"import {m}"], capture_output=True, check=False).returncode
    ]
    if missing:
        raise CheckError(
            f"python modules missing on this machine: {', '.join(missing)} (no network: carry wheels)"
        )
    stock_whl, patched_whl = find_wheels(args)
    work = Path(args.work or (REPO / "build" / "device" / "exllamav3"))
    work.mkdir(parents=True, exist_ok=True)
    sites = {"stock": work / "site-stock", "patched": work / "site-patched"}
    for name, wheel in (("stock", stock_whl), ("patched", patched_whl)):
        install(wheel, sites[name])
    arms = {name: ArmRunner(name, site, work, args.dry_run) for name, site in sites.items()}
    report: dict[str, Any] = {
        "version": 2,
        "engine": "exllamav3",
        "dry_run": args.dry_run,
        "wheels": {"stock": stock_whl.name, "patched": patched_whl.name},
        "budget": {"seconds": args.budget},
        # where the builds and probes fit the device session (estimates: scripts/device/plan.py)
        "schedule": plan.exl3_schedule(),
    }
    if not args.dry_run:
        import torch

        report["machine"] = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "arch_list": os.environ["TORCH_CUDA_ARCH_LIST"],
            "instrument": "cuda",
        }
    else:
        report["machine"] = {"device": "cpu (dry run)", "instrument": "cpu-census"}
    build_file = work / "build.json"
    if args.phase in ("build", "all"):
        report["build"] = build_phase(sites, work, dry_run=args.dry_run, jobs=args.jobs, deadline=deadline)
        build_file.write_text(json.dumps(report["build"], indent=2))
    elif build_file.is_file():
        report["build"] = json.loads(build_file.read_text())
    if args.phase in ("probes", "all"):
        ready = args.dry_run or all(extension_ready(s) for s in sites.values())
        try:
            if args.plan:
                entries = json.loads(Path(args.plan).read_text()).get("entries", [])
            else:  # resolved here from patches/exllamav3 (needs overlay's own dependencies)
                import records

                entries = records.resolve(REPO, "exllamav3")["entries"]
        except (OSError, ValueError, ImportError) as exc:
            raise CheckError(
                f"cannot read the plan ({exc}): pass --plan FILE, written by `python3 "
                f"scripts/device_check.py plan exllamav3 > FILE`"
            ) from exc
        if not entries:
            raise CheckError(
                "the plan has no ExLlamaV3 entries: pass the plan of `python3 scripts/device_check.py "
                "plan exllamav3`"
            )
        if not ready:
            report["measurements"] = [
                {
                    "key": k,
                    "status": "skipped",
                    "reason": "the extension was not built (see build): no arm can import exllamav3",
                    "patches": [],
                    "scenarios": [],
                }
                for k in sorted({e["key"] for e in entries if e["engine"] == "exllamav3"})
            ]
        else:
            last = _last_report(work, report["wheels"]) if args.resume else {}
            done = {m["key"]: m for m in last.get("measurements", []) if m.get("status") == "ok"}
            report["measurements"] = probes_phase(
                arms, entries, dry=args.dry_run, deadline=deadline, done=done
            )
            if (last.get("rings") or {}).get("ok"):
                report["rings"] = {**last["rings"], "carried": True}
            elif deadline.allows(plan.EXL3_CHECK_S["rings"]):
                report["rings"] = check_rings(arms, args.dry_run, deadline)
            else:
                report["rings"] = {"skipped": "over budget"}
            if (last.get("sampler_kernels") or {}).get("ok"):
                report["sampler_kernels"] = {**last["sampler_kernels"], "carried": True}
            elif deadline.allows(plan.EXL3_CHECK_S["sampler_kernels"]):
                report["sampler_kernels"] = check_sampler_kernels(arms["patched"], args.dry_run)
            else:
                report["sampler_kernels"] = {"skipped": "over budget"}
    report["budget"]["used"] = round(args.budget - deadline.left(), 1)
    if "measurements" in report:  # what a --resume call on this (warm) machine carries over
        (work / LAST_REPORT).write_text(json.dumps(report, default=str))
    failed = [m["key"] for m in report.get("measurements", []) if m["status"] == "failed"]
    build_ok = (
        args.dry_run
        or args.phase == "probes"
        or all((report.get("build") or {}).get(a, {}).get("ok", False) for a in ("stock", "patched"))
    )
    report["ok"] = (
        not failed
        and build_ok
        and (report.get("sampler_kernels") or {}).get("ok", True)
        and (report.get("rings") or {}).get("ok", True)
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--stock", help="stock wheel (default: build/cache/**/exllamav3-1.6.5-py3-none-any.whl)"
    )
    parser.add_argument("--patched", help="patched wheel (default: newest build/wheels/exllamav3/*.whl)")
    parser.add_argument("--plan", help="the resolved plan (python3 scripts/device_check.py plan exllamav3)")
    parser.add_argument("--phase", choices=("build", "probes", "all"), default="all")
    parser.add_argument("--work", help="work folder, kept between runs (default: build/device/exllamav3)")
    parser.add_argument(
        "--out",
        help="report file (default: $OUT/exllamav3-device.json or build/reports/exllamav3-device.json)",
    )
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for this phase")
    parser.add_argument(
        "--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2), help="nvcc jobs (ninja)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="carry over what an earlier call on this machine measured ok (same wheels; --work's last report)",
    )
    parser.add_argument("--shared-ext", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true", help="CPU: extension stand-in, reference kernels")
    args = parser.parse_args(argv)
    if args.shared_ext:
        print(
            "exllamav3-check: error: --shared-ext is gone: it ran stock Python on the patched C++ and hid the "
            "series' default-path C++ changes; the build phase now recompiles only the changed units per arm",
            file=sys.stderr,
        )
        return 2
    try:
        report = run(args)
    except CheckError as e:
        print(f"exllamav3-check: ERROR {e}", file=sys.stderr)
        return 2
    out = (
        Path(args.out)
        if args.out
        else (Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "build" / "reports")
        / "exllamav3-device.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, out)
    print(f"exllamav3-check: report {out} ({'ok' if report['ok'] else 'FAILED'})", file=sys.stderr)
    return 0 if report["ok"] else 4


if __name__ == "__main__":
    raise SystemExit(main())
