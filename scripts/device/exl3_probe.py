#!/usr/bin/env python3
"""One ExLlamaV3 device-census run inside one arm (stock or patched site on PYTHONPATH, the patch's flags in the
environment): the census metrics of the wheel's own code per step, then the time per step. Run by
scripts/device/exllamav3_check.py; request JSON on stdin, one JSON document on stdout.

Modes:

- ``{"mode": "spec", ...}``: tests/engines/exllamav3/probes/spec_round.py's rounds through the real
  ``Generator.iterate_gen`` (decode-step without drafts, spec-verify-step with them) and
  ``Generator.iterate_draftmodel_dflash_gen`` (draft-round). On the GPU: CUDA tensors, the real extension and sampler
  (the fused sampler on, upstream's default: sampler "fused-temp"), a stand-in target forward with a GPU workload.
  Fields: bsz, block, steps, sampler, embed ("host": the loader's placement, "device"), time_rounds.
- ``{"mode": "script", "probe": "swa_ring.py", "payload": {...}, "steps": ["module:Class.method", ...],
  "tag": SCENARIO}``: a probe script run as ``__main__`` with each call of the named methods as one census step
  (none named: the whole run is one step, e.g. a cache allocation), its own output kept.

``dry_run``: the CPU census (placement by ``is_cuda``: the probes' CensusDev device tensors) instead of the GPU
instrument, the extension stand-in, the reference kernels. Reports: {tag: census report}, per-step times {tag: [us]},
the EXL3_OVL_* switches read, the probe's outputs (for identity across configurations).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROBES = REPO / "tests" / "engines" / "exllamav3" / "probes"
WORKERS = REPO / "src" / "overlay" / "engines" / "workers"
FLAG_PREFIX = "EXL3_OVL_"
WARMUP = 1


class _RecordingEnviron(os._Environ):  # type: ignore[name-defined,misc]
    read: set[str] = set()  # noqa: RUF012 (shared by every instance on purpose)

    def __getitem__(self, key: str) -> str:
        if key.startswith(FLAG_PREFIX):
            _RecordingEnviron.read.add(key)
        return super().__getitem__(key)


def _instrument(dry_run: bool) -> Any:
    import cuda_census

    if not dry_run:
        return cuda_census.GpuInstrument()
    import _devsim

    return cuda_census.CpuInstrument(
        placement="is_cuda", device_class=_devsim.CensusDev, skip=(_devsim.__file__,)
    )


class _Timer:
    """Per-step device time (CUDA events read once at the end, so timing adds no host sync inside the steps)."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.pending: dict[str, list[Any]] = {}

    @contextlib.contextmanager
    def step(self, tag: str) -> Any:
        if self.dry_run:
            import time

            t0 = time.perf_counter()
            yield
            self.pending.setdefault(tag, []).append((time.perf_counter() - t0) * 1e6)
            return
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self.pending.setdefault(tag, []).append((start, end))

    def samples(self) -> dict[str, list[float]]:
        if self.dry_run:
            return {t: [round(x, 3) for x in v[WARMUP:]] for t, v in self.pending.items()}
        import torch

        torch.cuda.synchronize()
        return {
            t: [round(s.elapsed_time(e) * 1000.0, 3) for s, e in v[WARMUP:]] for t, v in self.pending.items()
        }


LAST_CALL: dict[str, Any] = {}


def _wrap(
    owner: Any, name: str, stepper: Callable[[Any, tuple[Any, ...], dict[str, Any]], str]
) -> Callable[[], None]:
    """Wrap ``owner.name`` so each call runs inside ``stepper``'s step; returns the undo. The last call is kept
    (``LAST_CALL``) for a capture check after the run."""
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        LAST_CALL.update(fn=original, args=args, kwargs=kwargs)
        with stepper(args, kwargs):  # type: ignore[attr-defined]
            return original(*args, **kwargs)

    setattr(owner, name, wrapped)
    return lambda: setattr(owner, name, original)


def spec(request: dict[str, Any]) -> dict[str, Any]:
    dry = bool(request.get("dry_run"))
    sys.path[:0] = [str(WORKERS), str(PROBES)]
    if not dry:
        os.environ["EXL3_FUSED_SAMPLER"] = os.environ.get("EXL3_FUSED_SAMPLER", "1")  # upstream's default
    import spec_round
    from exllamav3.generator import generator as gen_mod

    install_mocks = spec_round.install_cuda_mocks
    if dry:
        import _devsim

        _devsim.dev = lambda t: t.as_subclass(_devsim.CensusDev)
        spec_round.install_cuda_mocks = lambda: (
            None
        )  # the CPU census stands in for torch.cuda while it counts
    steps = int(request.get("steps", 3))
    payload = {
        "seed": 11,
        "bsz": int(request.get("bsz", 2)),
        "block": int(request.get("block", 8)),
        "sampler": request.get("sampler", "temp" if dry else "fused-temp"),
        "embed": request.get("embed", "host"),
        "corrupt": 20,
    }
    if not dry:
        payload.update(device="cuda", work=int(request.get("work", 20)))

    def tag_of(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if name == "iterate_draftmodel_dflash_gen":
            return "draft-round"
        drafts = args[2] if len(args) > 2 else kwargs.get("draft_tokens")
        return "decode-step" if drafts is None else "spec-verify-step"

    def run_with(step_cm: Callable[[str], Any], rounds: int) -> dict[str, Any]:
        undo = []
        for name in ("iterate_gen", "iterate_draftmodel_dflash_gen"):

            def stepper(args: tuple[Any, ...], kwargs: dict[str, Any], _n: str = name) -> Any:
                return step_cm(tag_of(_n, args, kwargs))

            undo.append(_wrap(gen_mod.Generator, name, stepper))
        try:
            return dict(spec_round.case({**payload, "rounds": rounds, "decode_rounds": rounds}))
        finally:
            for u in undo:
                u()

    inst = _instrument(dry)
    plain = os.environ.__class__
    os.environ.__class__ = _RecordingEnviron
    try:
        with inst:
            out = run_with(inst.step, steps + WARMUP)
    finally:
        os.environ.__class__ = plain
    reports = {
        tag: inst.report(tag=tag, skip=WARMUP) for tag in ("decode-step", "spec-verify-step", "draft-round")
    }
    timer = _Timer(dry)
    spec_round.install_cuda_mocks = (
        install_mocks  # dry run: the probe's own torch.cuda stand-ins while it is timed
    )
    run_with(timer.step, int(request.get("time_rounds", 20)) + WARMUP)
    return {
        "reports": reports,
        "time": timer.samples(),
        "flags_read": sorted(_RecordingEnviron.read),
        "outputs": {k: out.get(k) for k in ("tokens", "accepted", "rejected", "kv_positions")},
        "machine": inst.machine(),
        "payload": payload,
    }


def script(request: dict[str, Any]) -> dict[str, Any]:
    dry = bool(request.get("dry_run"))
    sys.path[:0] = [str(WORKERS), str(PROBES)]
    tag = request.get("tag", "draft-round")
    targets = []
    for spec_ in request.get("steps", []):
        module, _, attr = spec_.partition(":")
        owner: Any = importlib.import_module(module)
        parts = attr.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part)
        targets.append((owner, parts[-1]))

    def run_with(step_cm: Callable[[str], Any]) -> str:
        undo = [_wrap(owner, name, lambda a, k: step_cm(tag)) for owner, name in targets]
        buf = io.StringIO()
        saved_in, saved_out = sys.stdin, sys.stdout
        sys.stdin, sys.stdout = io.StringIO(json.dumps(request.get("payload", {}))), buf
        try:
            if targets:
                runpy.run_path(str(PROBES / request["probe"]), run_name="__main__")
            else:
                with step_cm(tag):
                    runpy.run_path(str(PROBES / request["probe"]), run_name="__main__")
        finally:
            sys.stdin, sys.stdout = saved_in, saved_out
            for u in undo:
                u()
        return buf.getvalue()

    inst = _instrument(dry)
    plain = os.environ.__class__
    os.environ.__class__ = _RecordingEnviron
    try:
        with inst:
            text = run_with(inst.step)
    finally:
        os.environ.__class__ = plain
    skip = WARMUP if targets else 0
    report = inst.report(tag=tag, skip=skip)
    capture = None
    if request.get("capture") and LAST_CALL:
        # the region meant for a CUDA graph: one more call of the last step, with its arguments, really captured
        # (after the schedule: it advances the state, nothing is compared after it)
        call = dict(LAST_CALL)
        with inst:
            try:
                capture = inst.capturable(lambda: call["fn"](*call["args"], **call["kwargs"]), warmup=1)
            except Exception as exc:
                capture = {
                    "capturable": None,
                    "site": None,
                    "error": f"not measured: the last step does not run again outside the schedule "
                    f"({type(exc).__name__}: {str(exc)[:300]})",
                }
        report["metrics"]["capturable"] = capture["capturable"]
    timer = _Timer(dry)
    if targets and request.get("time", True):
        run_with(timer.step)
    lines = [line for line in text.splitlines() if line.strip()]
    return {
        "reports": {tag: report},
        "time": timer.samples(),
        "flags_read": sorted(_RecordingEnviron.read),
        "outputs": json.loads(lines[-1]) if lines else None,
        "machine": inst.machine(),
        "capture": capture,
    }


def main() -> None:
    request = json.loads(sys.stdin.read() or "{}")
    mode = request.get("mode")
    if mode not in ("spec", "script"):
        raise SystemExit(f"exl3_probe: unknown mode {mode!r}; expected 'spec' or 'script'")
    doc = spec(request) if mode == "spec" else script(request)
    sys.stdout.write(json.dumps(doc, default=str) + "\n")


if __name__ == "__main__":
    main()
