#!/usr/bin/env python3
"""SGLang device census: the census metrics (host syncs with sites, launches, H2D pageable/pinned, bytes, peak
memory, capturability) and time of each planned region, stock vs patched flag off vs patched flag on.

Runs on a machine with an NVIDIA GPU and no network (``scripts/device_check.sh run`` drives it). Both arms are SGLang
trees (a folder holding ``sglang/``, or a wheel to unzip): the stock 0.5.23 wheel and the wheel ``overlay apply
sglang`` builds. Every probe (scripts/device/plan.py, keyed by patch-name prefix and scenario, never by line numbers)
builds its region from each configuration's own modules: ``stock`` (stock arm), ``flag_off`` (patched arm, the patch's
flag unset: the patch's own off path) and ``patched`` (patched arm, flag on); the same inputs go through all three
and the outputs are compared. Per configuration: a counted pass (``cuda_census``: the GPU instrument, or on
``--dry-run`` the CPU census), a capture pass where the probe measures ``capturable``, then one timed pass with the
configurations interleaved (ABBA, module sets swapped in between calls, never counted and timed at once).

Output (``--out``, written atomically)::

    {"version": 2, "engine": "sglang", "dry_run": bool, "machine": {...}, "budget": {...},
     "measurements": [{"key", "scenario", "patch", "metrics", "region", "status": "ok"|"skipped"|"failed",
                       "reason", "configs": {"stock"|"flag_off"|"patched": {"report": census report | null,
                       "capture": {...} | null, "error": str | null}}, "equal": {...}, "time": {...}}]}

``scripts/device_check.py`` turns it into census records (patch, metric, scenario, flag, stock, patched, declared,
holds, sites) with the series' trailers. The region, not the whole engine, is what runs: SGLang's GPU engine needs
the sgl_kernel and flashinfer CUDA wheels, which cannot travel (over the 64 MiB carry limit), so a region whose stock
side is an sgl_kernel op reports that side as not measured, and probes inside the engine's runners are planned as
pending (plan.py).

``--dry-run`` runs every probe on the CPU (SGLang's CPU engine path, Triton through ``TRITON_INTERPRET=1``, the CPU
census as instrument) so the scenario list, budget, JSON and report code run without a GPU; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src" / "overlay" / "engines" / "workers"))

import cuda_census
import plan

SCHEMA_VERSION = 2
CONFIGS = ("stock", "flag_off", "patched")


# --- arms -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    name: str
    root: Path  # a folder holding the sglang package


def unpack(source: Path, into: Path) -> Path:
    """A folder holding ``sglang/``: ``source`` itself, or the wheel ``source`` unzipped under ``into``."""
    if source.is_dir():
        if not (source / "sglang").is_dir():
            raise SystemExit(
                f"error: {source} holds no sglang/ folder; pass an SGLang wheel or its unpacked tree"
            )
        return source
    if not zipfile.is_zipfile(source):
        raise SystemExit(
            f"error: {source} is neither a folder nor a wheel; pass the stock or the patched wheel"
        )
    with zipfile.ZipFile(source) as wheel:
        wheel.extractall(into, [m for m in wheel.namelist() if m.startswith("sglang/")])
    return into


def _sglang_modules() -> dict[str, Any]:
    return {n: m for n, m in sys.modules.items() if n == "sglang" or n.startswith("sglang.")}


def _purge() -> None:
    for name in list(_sglang_modules()):
        del sys.modules[name]


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class Loaded:
    """One configuration's modules (kept to swap them back in for the timed pass) and environment."""

    arm: Arm
    env: dict[str, str]
    modules: dict[str, Any] = field(default_factory=dict)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        saved = _sglang_modules()
        _purge()
        sys.modules.update(self.modules)
        sys.path.insert(0, str(self.arm.root))
        try:
            with environ(self.env):
                yield
        finally:
            sys.path.remove(str(self.arm.root))
            self.modules.update(_sglang_modules())
            _purge()
            sys.modules.update(saved)


# --- probes ---------------------------------------------------------------------------------------------------------


class Skip(Exception):
    """This configuration cannot run the region (the reason becomes the configuration's error)."""


@dataclass
class Region:
    step: Callable[[], Any]  # one step of the scenario (counted, timed)
    capture: Callable[[], Any] | None = (
        None  # the part meant for a CUDA graph, when the probe measures capturable
    )
    outputs: Callable[[Any], Any] | None = None  # comparable outputs of one step's result
    note: str | None = None


@dataclass
class Ctx:
    torch: Any
    device: str
    dry_run: bool
    inst: Any = None

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


Builder = Callable[[Ctx, Callable[[str], Any], str], Region]
PROBES: dict[str, Builder] = {}


def probe(key: str) -> Callable[[Builder], Builder]:
    def register(fn: Builder) -> Builder:
        PROBES[key] = fn
        return fn

    return register


def _set(module: Any, **values: Any) -> None:
    for name, value in values.items():
        if hasattr(module, name):
            setattr(module, name, value)


@probe("future-map-resolve")
def p_future_map_resolve(ctx: Ctx, imp: Callable[[str], Any], config: str) -> Region:
    torch = ctx.torch
    ou = imp("sglang.srt.managers.overlap_utils")
    spec = imp("sglang.srt.speculative.spec_info")
    pool = SimpleNamespace(req_to_token=torch.zeros((64, 4096), dtype=torch.int32, device=ctx.device))
    fm = ou.FutureMap(
        torch.device(ctx.device), spec.SpeculativeAlgorithm.EAGLE, pool, needs_cpu_seq_lens=True
    )
    idx = torch.arange(1, 5, dtype=torch.int64, device=ctx.device)  # 4 requests of a 64-slot pool
    idx_cpu = idx.cpu()
    lens = torch.tensor([1000, 2000, 3000, 4000], dtype=torch.int64, device=ctx.device)
    # the verify forward still running when the scheduler resolves: ~200 us of GPU work on the current stream
    busy = (lambda: torch.cuda._sleep(200_000)) if ctx.cuda else (lambda: None)

    def step() -> Any:
        busy()
        fm.publish(idx, lens)
        batch = SimpleNamespace(
            spec_info=SimpleNamespace(future_indices=idx),
            req_pool_indices_cpu=idx_cpu,
            seq_lens=None,
            seq_lens_cpu=None,
            seq_lens_sum=None,
        )
        fm.resolve_seq_lens_cpu(batch)
        return batch.seq_lens_cpu, batch.seq_lens_sum

    layout = (
        "pinned mirror + private D2H stream" if fm.fwd_prepare_d2h_stream is not None else "bootstrap .cpu()"
    )
    return Region(
        step,
        outputs=lambda r: [r[0].tolist(), r[1]],
        note=f"the wheel's FutureMap ({layout}), no patch: the three configurations are the same code",
    )


@probe("topk-topp-sample")
def p_topk_topp_sample(ctx: Ctx, imp: Callable[[str], Any], config: str) -> Region:
    torch = ctx.torch
    vocab = 4096 if ctx.dry_run else 151552
    fn = imp("sglang.srt.layers.sampler").top_k_top_p_min_p_sampling_from_probs_torch
    g = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(2, vocab, generator=g), -1).to(ctx.device)
    ks = torch.full((2,), 50, dtype=torch.int32, device=ctx.device)
    ps = torch.full((2,), 0.9, device=ctx.device)
    mins = torch.zeros(2, device=ctx.device)
    pos = torch.zeros(2, dtype=torch.long, device=ctx.device)

    def step() -> Any:
        return fn(probs.clone(), ks, ps, mins, False, None, pos)

    return Region(
        step, note="sampled tokens differ by design (multinomial vs Gumbel race): outputs not compared"
    )


@probe("fp8-lm-head")
def p_fp8_lm_head(ctx: Ctx, imp: Callable[[str], Any], config: str) -> Region:
    torch = ctx.torch
    lp = imp("sglang.srt.layers.logits_processor")
    compute = getattr(lp.LogitsProcessor, "_compute_lm_head", None)
    if compute is None:
        raise Skip("this arm's LogitsProcessor has no _compute_lm_head")
    vocab, hidden = (512, 64) if ctx.dry_run else (151552, 6144)
    dtype = torch.float32 if ctx.dry_run else torch.bfloat16
    g = torch.Generator().manual_seed(7)
    head = torch.nn.Module()
    head.weight = torch.nn.Parameter(
        (torch.randn(vocab, hidden, generator=g) * 0.02).to(dtype).to(ctx.device), requires_grad=False
    )
    me = SimpleNamespace(use_fp32_lm_head=False, use_fp32_lm_head_output=False, rl_on_policy_target=None)
    if hasattr(lp.LogitsProcessor, "fp8_lm_head_applies"):
        me.fp8_lm_head_applies = lambda m: lp.LogitsProcessor.fp8_lm_head_applies(me, m)
    if config == "patched":  # what ModelRunner.initialize does at load with the flag
        imp("sglang.srt.layers.quantization.fp8_lm_head").prepare_fp8_lm_head(head)
    h = (torch.randn(4, hidden, generator=g) * 0.5).to(dtype).to(ctx.device)

    def step() -> Any:
        return compute(me, h, head)

    return Region(
        step,
        outputs=lambda r: r.float().argmax(-1).cpu().tolist(),
        note="LogitsProcessor._compute_lm_head, 4 rows; outputs compared as top-1 ids",
    )


def _block_fp8(torch: Any, n: int, k: int, device: str) -> tuple[Any, Any]:
    g = torch.Generator(device="cpu").manual_seed(1)
    w = torch.randn(n, k, generator=g) * 0.05
    ws = torch.rand(n // 128, k // 128, generator=g) * 0.01 + 0.001
    wq = (w / ws.repeat_interleave(128, 0).repeat_interleave(128, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    return wq.to(device), ws.to(device)


@probe("splitk-fp8-gemm")
def p_splitk(ctx: Ctx, imp: Callable[[str], Any], config: str) -> Region:
    torch = ctx.torch
    fu = imp("sglang.srt.layers.quantization.fp8_utils")
    n, k = (256, 512) if ctx.dry_run else (2112, 7168)
    wq, ws = _block_fp8(torch, n, k, ctx.device)
    x = torch.randn(4, k, device=ctx.device).to(torch.bfloat16)
    note = "fp8_utils.dispatch_w8a8_block_fp8_linear([128, 128]) chooses, 4 rows, N 2112 K 7168"
    try:
        linear = fu.dispatch_w8a8_block_fp8_linear([128, 128])
    except Exception as exc:
        linear = fu.triton_w8a8_block_fp8_linear
        note += (
            f"; dispatch failed ({type(exc).__name__}: {str(exc)[:120]}), triton_w8a8_block_fp8_linear used"
        )
    if ctx.dry_run and config == "patched":
        sk = imp("sglang.kernels.ops.gemm.splitk_fp8")
        linear = sk.splitk_w8a8_block_fp8_linear_torch  # the Triton kernel needs a GPU; its torch reference
    elif ctx.dry_run:
        raise Skip("dry run: the stock Triton block-FP8 GEMM needs a GPU config")
    name = getattr(linear, "__name__", getattr(getattr(linear, "func", None), "__name__", repr(linear)))

    def step() -> Any:
        return linear(x, wq, [128, 128], ws)

    return Region(step, outputs=lambda r: r.float().cpu(), note=f"{note}; linear: {name}")


# --- the harness ----------------------------------------------------------------------------------------------------


def _equal(torch: Any, a: Any, b: Any) -> bool | float:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return False
        if a.dtype.is_floating_point:
            err = float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
            return True if err == 0.0 else err
        return bool(torch.equal(a, b))
    return bool(a == b)


def _strip_sites(report: dict[str, Any] | None, capture: dict[str, Any] | None, root: Path) -> None:
    """Sites relative to the arm's tree (``sglang/...``), as they read in the wheel."""
    prefix = str(root) + os.sep

    def fix(site: str) -> str:
        return site[len(prefix) :] if site.startswith(prefix) else site

    if report:
        report["sites"] = {
            m: [[fix(s), n] for s, n in rows] for m, rows in (report.get("sites") or {}).items()
        }
    if capture and capture.get("site"):
        capture["site"] = fix(capture["site"])
        if capture.get("error"):
            capture["error"] = capture["error"].replace(prefix, "")


def run_probe(
    ctx: Ctx,
    key: str,
    entries: list[dict[str, Any]],
    arms: dict[str, Arm],
    *,
    steps: int,
    warmup: int,
    rounds: int,
    modules: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Count, capture and time one probe in the three configurations (``modules``: each arm's imported modules,
    shared by its configurations and by every probe, so each arm is imported once)."""
    torch = ctx.torch
    flags = dict(entries[0].get("env") or {})
    scenario = entries[0]["scenario"]
    metrics = sorted({m for e in entries for m in e["metrics"]})
    loaded = {
        "stock": Loaded(arms["stock"], {}, modules["stock"]),
        "flag_off": Loaded(arms["patched"], {}, modules["patched"]),
        "patched": Loaded(arms["patched"], flags, modules["patched"]),
    }
    out: dict[str, Any] = {"configs": {}, "equal": {}}
    regions: dict[str, Region] = {}
    results: dict[str, Any] = {}
    for name, cfg in loaded.items():
        row: dict[str, Any] = {"report": None, "capture": None, "error": None}
        try:
            with cfg.active():
                # the dry run's CPU census counts multinomial as its kernel's ops, as the engine census does (a GPU
                # trace sees those kernels anyway)
                inst = cuda_census.instrument(ctx.dry_run, cpu_is_device=True, expand=("multinomial",))
                ctx.inst = inst
                region = PROBES[key](ctx, importlib.import_module, name)
                with inst:
                    for _ in range(warmup + steps):
                        with inst.step(scenario):
                            result = region.step()
                row["report"] = inst.report(tag=scenario, skip=warmup)
                if "capturable" in metrics and region.capture is not None:
                    with inst:
                        row["capture"] = inst.capturable(region.capture)
                    row["report"]["metrics"]["capturable"] = row["capture"]["capturable"]
                regions[name], results[name] = region, result
                _strip_sites(row["report"], row["capture"], cfg.arm.root)
                if region.note:
                    row["note"] = region.note
        except Skip as skip:
            row["error"] = str(skip)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).strip()[:400]}"
            row["traceback"] = traceback.format_exc()[-2000:]
        finally:
            ctx.inst = None
        out["configs"][name] = row
    for name in ("stock", "flag_off"):
        if name in results and "patched" in results and regions["patched"].outputs is not None:
            try:
                a, b = regions[name].outputs(results[name]), regions["patched"].outputs(results["patched"])  # type: ignore[misc]
                pairs = list(zip(a, b)) if isinstance(a, list) else [(a, b)]
                verdicts = [_equal(torch, x, y) for x, y in pairs]
                out["equal"][f"{name}_vs_patched"] = all(v is True for v in verdicts) or max(
                    (v for v in verdicts if not isinstance(v, bool)), default=False
                )
            except Exception as exc:
                out["equal"][f"{name}_vs_patched"] = f"not compared: {type(exc).__name__}: {exc}"
    if regions:
        samples: dict[str, list[float]] = {n: [] for n in regions}
        timer = cuda_census.instrument(ctx.dry_run, cpu_is_device=True)
        for name in cuda_census.interleave(list(regions), rounds):
            with loaded[name].active():
                for _ in range(2 if not samples[name] else 0):
                    regions[name].step()
                samples[name].append(timer.time_us(regions[name].step))
        base = "flag_off" if "flag_off" in samples else "stock"
        out["time"] = {"samples": {n: len(s) for n, s in samples.items()}}
        if "patched" in samples:
            out["time"]["flag_off_vs_patched"] = cuda_census.ratio_interval(
                samples.get(base, []), samples["patched"]
            )
            if "stock" in samples:
                out["time"]["stock_vs_patched"] = cuda_census.ratio_interval(
                    samples["stock"], samples["patched"]
                )
    return out


class ProbeTimeout(BaseException):
    """A probe ran past its time limit (BaseException: the probes' own `except Exception` must not swallow it)."""


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    import signal

    def fire(signum: int, frame: Any) -> None:
        raise ProbeTimeout()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(
    *,
    stock: Arm,
    patched: Arm,
    dry_run: bool,
    plan_doc: dict[str, Any],
    budget_s: float,
    steps: int,
    rounds: int,
) -> dict[str, Any]:
    import torch

    device = "cuda" if (torch.cuda.is_available() and not dry_run) else "cpu"
    if not dry_run and device != "cuda":
        raise SystemExit(
            "error: no CUDA device visible; run on the GPU machine, or pass --dry-run to test the harness"
        )
    ctx = Ctx(torch=torch, device=device, dry_run=dry_run)
    deadline = plan.Deadline(budget_s)
    by_key: dict[str, list[dict[str, Any]]] = {}
    for entry in plan_doc.get("entries", []):
        if entry["engine"] == "sglang":
            by_key.setdefault(entry["key"], []).append(entry)
    measurements = []
    modules: dict[str, dict[str, Any]] = {"stock": {}, "patched": {}}
    asked = set(plan_doc.get("keys") or by_key) | {p.key for p in plan.probes("sglang") if p.baseline}
    for planned in plan.budget_plan("sglang", budget_s, keys=asked):
        key = planned.probe.key
        entries = [e for e in by_key.get(key) or [] if not e.get("pending")]
        m: dict[str, Any] = {
            "key": key,
            "region": planned.probe.region,
            "scenarios": sorted({e["scenario"] for e in entries}) or [planned.probe.scenario],
            "patches": sorted({e["patch"] for e in entries}),
            "status": "ok",
            "reason": None,
        }
        if planned.probe.baseline and planned.run:
            # no patch yet: stock measured in all three configurations (no flag), to size the gap
            entries = [
                {"scenario": planned.probe.scenario, "metrics": list(planned.probe.metrics), "env": {}}
            ]
            m.update(scenarios=[planned.probe.scenario], baseline=planned.probe.baseline)
        if planned.probe.baseline and not planned.run:
            m.update(status="skipped", reason=planned.reason)
        elif planned.probe.baseline and key not in PROBES:
            m.update(status="skipped", reason="pending: no implementation in this script version")
        elif planned.probe.baseline:
            pass
        elif not by_key.get(key):
            m.update(status="skipped", reason="no patch of the series as it is matches this probe")
        elif not planned.run or not entries:
            m.update(status="skipped", reason=planned.reason or "pending: every mechanism of it is pending")
        elif key not in PROBES:
            m.update(status="skipped", reason="pending: no implementation in this script version")
        elif not deadline.allows(planned.probe.seconds):
            m.update(
                status="skipped",
                reason=f"over budget: ~{planned.probe.seconds} s needed, {int(deadline.left())} s left",
            )
        if m["status"] == "ok":
            t0 = time.monotonic()
            # a per-probe time limit: three times its estimate (ten on a dry run's shared CPU), never past the budget
            factor = 10 if dry_run else 3
            limit = int(max(10, min(deadline.left(), factor * planned.probe.seconds + 20)))
            try:
                with _alarm(limit):
                    for scenario in m["scenarios"]:
                        group = [e for e in entries if e["scenario"] == scenario]
                        m.setdefault("by_scenario", {})[scenario] = run_probe(
                            ctx,
                            key,
                            group,
                            {"stock": stock, "patched": patched},
                            steps=steps,
                            warmup=1,
                            rounds=rounds,
                            modules=modules,
                        )
            except ProbeTimeout:
                m.update(status="failed", reason=f"over its time limit of {limit} s")
            m["wall_s"] = round(time.monotonic() - t0, 2)
            if m["status"] == "ok" and all(
                row["error"] for r in m["by_scenario"].values() for row in r["configs"].values()
            ):
                m["status"] = "failed"
                m["reason"] = "every configuration failed"
        measurements.append(m)
        print(
            f"sglang_check: {key}: {m['status']}{' (' + m['reason'] + ')' if m['reason'] else ''}",
            file=sys.stderr,
            flush=True,
        )
    inst = cuda_census.instrument(dry_run, cpu_is_device=True)
    return {
        "version": SCHEMA_VERSION,
        "engine": "sglang",
        "dry_run": dry_run,
        "machine": inst.machine(),
        "budget": {"seconds": budget_s, "used": round(deadline.seconds - deadline.left(), 1)},
        "steps": steps,
        "rounds": rounds,
        "measurements": measurements,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stock", type=Path, required=True, help="stock SGLang wheel or unpacked tree")
    parser.add_argument("--patched", type=Path, required=True, help="patched SGLang wheel or unpacked tree")
    parser.add_argument(
        "--plan",
        type=Path,
        help="the resolved plan (scripts/device_check.py plan sglang > plan.json; default: resolved "
        "here from patches/sglang, which needs overlay's own dependencies)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("sglang-device.json"), help="JSON report (atomic write)"
    )
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for this engine's probes")
    parser.add_argument(
        "--steps", type=int, default=3, help="counted steps per configuration (after one warm-up)"
    )
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds per configuration (interleaved)")
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreter: harness only"
    )
    args = parser.parse_args(argv)
    try:
        if args.plan is None:
            import records

            plan_doc = records.resolve(REPO, "sglang")
        else:
            plan_doc = json.loads(args.plan.read_text())
    except (OSError, ValueError, ImportError) as exc:
        print(
            f"sglang_check: error: cannot read the plan {args.plan}: {exc}; write it with "
            f"`python3 scripts/device_check.py plan sglang > plan.json`",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    with tempfile.TemporaryDirectory(prefix="sglang-check-") as tmp:
        stock = Arm("stock", unpack(args.stock, Path(tmp) / "stock"))
        patched = Arm("patched", unpack(args.patched, Path(tmp) / "patched"))
        report = run(
            stock=stock,
            patched=patched,
            dry_run=args.dry_run,
            plan_doc=plan_doc,
            budget_s=args.budget,
            steps=max(1, args.steps),
            rounds=max(2, args.rounds),
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".tmp")
    partial.write_text(json.dumps(report, indent=2, default=str) + "\n")
    os.replace(partial, args.out)
    failed = [m["key"] for m in report["measurements"] if m["status"] == "failed"]
    print(
        f"sglang_check: wrote {args.out} ({len(report['measurements'])} probes, failed: {failed or 'none'})",
        file=sys.stderr,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
