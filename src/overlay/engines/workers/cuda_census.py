"""The census metrics of torch_census, measured on a real CUDA device, plus time (device scripts; never imports
overlay, runs inside an engine arm).

``instrument(dry_run)`` gives one of two objects with the same API, so a device script runs the same code on a GPU and
in its CPU dry run; only what needs CUDA is replaced:

- ``GpuInstrument`` (CUDA): host syncs from ``torch.cuda.set_sync_debug_mode("warn")`` (every synchronizing CUDA call
  torch makes: ``.item()``, ``.cpu()``, blocking copies either way, ``nonzero``, ``Stream.synchronize``...), each with
  its call site (the first frame outside torch and this module), plus the explicit waits (``torch.cuda.synchronize``,
  ``Event.synchronize``, ``Stream.synchronize``, counted once); launches, H2D copies (pageable vs pinned, from CUPTI's
  memcpy kind) and bytes copied between host and device from a ``torch.profiler`` trace of the step (kernels and
  memsets; those whose correlation id is a ``cudaGraphLaunch`` count as graph-launches, the rest as eager-launches;
  launch sites from the trace's Python stacks); gemm-bytes from the matrix-multiply ops' recorded input shapes and
  dtypes; peak memory as ``torch.cuda.max_memory_allocated()`` above the step's
  start; capturability by really capturing the region under ``torch.cuda.graph(capture_error_mode="global")`` with
  the sync debug mode set to raise (False with the error and its site); time with CUDA events.
- ``CpuInstrument`` (dry run): the CPU census (``torch_census.Census``) and ``time.perf_counter``.

Both report per step in torch_census's shape (``report()``: steps, metrics, sites, kinds, per_step, violations).

Pure helpers (CPU-testable, in cuda_census_trace.py, re-exported here): ``parse_trace`` (a chrome trace -> counts, kinds, launch sites), ``interleave`` (ABBA
order of timed calls over several configurations), ``ratio_interval`` (median times and a bootstrap interval of
their ratio).

Blind spots of the GPU instrument (named in the report's notes by the device scripts): a wait the engine makes from C++
without torch's sync check (a custom extension's own ``cudaStreamSynchronize``) is not seen; a kernel launched by a
library that CUPTI does not trace is not counted; profiling adds host time, so counts and times come from separate
passes (counted steps are never timed).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cuda_census_trace import (
    COUNTED,
    call_site,
    exception_site,
    interleave,
    parse_trace,
    ratio_interval,
    torch_dir_path,
)

__all__ = [
    "COUNTED",
    "CpuInstrument",
    "GpuInstrument",
    "call_site",
    "exception_site",
    "instrument",
    "interleave",
    "parse_trace",
    "ratio_interval",
    "timed",
]

_THIS = os.path.abspath(__file__)


# --- instruments ---------------------------------------------------------------------------------------------------


@dataclass
class _Step:
    tag: str | None
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    sites: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    peak: int = 0


def _report(steps: list[_Step]) -> dict[str, Any]:
    n = len(steps)
    metrics: dict[str, Any] = {m: (sum(s.counts[m] for s in steps) / n if n else 0.0) for m in COUNTED}
    metrics["peak-memory"] = float(max((s.peak for s in steps), default=0))
    metrics["capturable"] = None
    sites: dict[str, list[list[Any]]] = {}
    for m in COUNTED:
        total: collections.Counter[str] = collections.Counter()
        for s in steps:
            total.update(s.sites.get(m, {}))
        if total:
            sites[m] = [[k, v] for k, v in sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))]
    kinds: collections.Counter[str] = collections.Counter()
    for s in steps:
        kinds.update(s.kinds)
    return {
        "steps": n,
        "metrics": metrics,
        "sites": sites,
        "kinds": dict(sorted(kinds.items())),
        "per_step": [{m: s.counts[m] for m in COUNTED} | {"peak-memory": s.peak} for s in steps],
        "violations": [],
    }


class GpuInstrument:
    """Counts and times on CUDA (see the module docstring)."""

    kind = "cuda"

    def __init__(self, *, stacks: bool = True) -> None:
        import torch

        self.torch = torch
        self.stacks = stacks
        self.device = "cuda"
        self._torch_dir = torch_dir_path()
        self._steps: list[_Step] = []
        self._current: _Step | None = None
        self._explicit = 0
        self._patches: list[tuple[Any, str, Any]] = []

    # explicit waits: counted once, the sync-debug warning they raise inside is not counted again
    def __enter__(self) -> GpuInstrument:
        torch = self.torch
        inst = self

        def wrap(owner: Any, name: str, kind: str) -> None:
            original = getattr(owner, name)

            def counted(*args: Any, **kwargs: Any) -> Any:
                inst._sync(kind, call_site(inst._torch_dir))
                inst._explicit += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    inst._explicit -= 1

            self._patches.append((owner, name, original))
            setattr(owner, name, counted)

        wrap(torch.cuda, "synchronize", "torch.cuda.synchronize")
        wrap(torch.cuda.Event, "synchronize", "Event.synchronize")
        wrap(torch.cuda.Stream, "synchronize", "Stream.synchronize")
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches = []

    def _sync(self, kind: str, site: str) -> None:
        step = self._current
        if step is None or self._explicit:
            return
        step.counts["host-syncs"] += 1
        step.kinds[f"host-syncs:{kind}"] += 1
        step.sites["host-syncs"][site] += 1

    def _on_warning(
        self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if "synchronizing CUDA operation" in str(message):
            self._sync("sync-debug", call_site(self._torch_dir))

    def count(self, metric: str, n: int = 1, *, kind: str | None = None, site: str | None = None) -> None:
        step = self._current
        if step is None:
            return
        step.counts[metric] += n
        step.sites[metric][site or call_site(self._torch_dir)] += n
        if kind:
            step.kinds[f"{metric}:{kind}"] += n

    @contextlib.contextmanager
    def step(self, tag: str | None = None) -> Iterator[_Step]:
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        step = _Step(tag)
        self._steps.append(step)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        prof = profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            with_stack=self.stacks,
            record_shapes=True,  # gemm-bytes reads the matrix multiplies' input shapes and dtypes
        )
        mode = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = self._on_warning
            prof.__enter__()
            torch.cuda.set_sync_debug_mode("warn")
            self._current = step
            try:
                yield step
            finally:
                self._current = None
                torch.cuda.set_sync_debug_mode(mode)
                prof.__exit__(None, None, None)
        torch.cuda.synchronize()
        step.peak = max(0, torch.cuda.max_memory_allocated() - base)
        with tempfile.TemporaryDirectory(prefix="cuda-census-") as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as fh:
                parsed = parse_trace(json.load(fh), torch_dir=self._torch_dir)
        for metric, n in parsed["counts"].items():
            step.counts[metric] += n
        step.kinds.update(parsed["kinds"])
        for metric, by_site in parsed["sites"].items():
            step.sites[metric].update(by_site)

    def report(self, *, tag: str | None = None, skip: int = 0) -> dict[str, Any]:
        return _report([s for s in self._steps if tag is None or s.tag == tag][skip:])

    def capturable(self, fn: Callable[[], Any], *, warmup: int = 2) -> dict[str, Any]:
        """Capture ``fn`` in a CUDA graph (global error mode, syncs raise); replay it once. ``{"capturable": bool,
        "error", "site", "graph_kernels"}``."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        mode = torch.cuda.get_sync_debug_mode()
        try:
            torch.cuda.set_sync_debug_mode("error")
            try:
                with torch.cuda.graph(graph, capture_error_mode="global"):
                    fn()
            finally:
                torch.cuda.set_sync_debug_mode(mode)
        except Exception as exc:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
            # the first failure inside the region is the answer; a capture_end error raised while unwinding it
            # comes second (its __context__ is the first)
            first = exc.__context__ if isinstance(exc.__context__, Exception) else exc
            sites = [exception_site(e, self._torch_dir) for e in (first, exc)]
            return {
                "capturable": False,
                "error": f"{type(first).__name__}: {str(first).strip()[:300]}",
                "site": next((s for s in sites if s != "?:0"), "?:0"),
            }
        with self.step("replay") as _:
            graph.replay()
        replay = self._steps.pop()
        return {
            "capturable": True,
            "error": None,
            "site": None,
            "graph_kernels": replay.counts["graph-launches"] or replay.counts["eager-launches"],
        }

    def time_us(self, fn: Callable[[], Any]) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end) * 1000.0)

    def machine(self) -> dict[str, Any]:
        torch = self.torch
        return {
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "capability": list(torch.cuda.get_device_capability(0)),
            "instrument": self.kind,
        }


class CpuInstrument:
    """The dry run's instrument: the CPU census (torch_census) and perf_counter, with GpuInstrument's API."""

    kind = "cpu-census"

    def __init__(self, **census_options: Any) -> None:
        sys.path.insert(0, os.path.dirname(_THIS))
        from torch_census import CaptureViolation, Census

        self._violation_type = CaptureViolation
        self.census = Census(**census_options)
        self.device = "cpu"

    def __enter__(self) -> CpuInstrument:
        self.census.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.census.__exit__(*exc)

    def count(self, metric: str, n: int = 1, *, kind: str | None = None, site: str | None = None) -> None:
        self.census.count(metric, n, kind=kind, site=site)

    @contextlib.contextmanager
    def step(self, tag: str | None = None) -> Iterator[Any]:
        with self.census.step(tag) as s:
            yield s

    def report(self, *, tag: str | None = None, skip: int = 0) -> dict[str, Any]:
        report = self.census.report(tag=tag, skip=skip)
        report["metrics"]["capturable"] = None
        return report

    def capturable(self, fn: Callable[[], Any], *, warmup: int = 2) -> dict[str, Any]:
        """Inside ``with inst:``: the CPU census's capturable region (raises at the first host read)."""
        for _ in range(warmup):
            fn()
        try:
            with self.census.step("capture"), self.census.capturable():
                fn()
        except self._violation_type as exc:
            return {"capturable": False, "error": str(exc), "site": exc.site}
        return {"capturable": True, "error": None, "site": None, "graph_kernels": None}

    def time_us(self, fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6

    def machine(self) -> dict[str, Any]:
        import torch

        return {"device": "cpu (dry run)", "torch": torch.__version__, "instrument": self.kind}


def instrument(dry_run: bool, **census_options: Any) -> GpuInstrument | CpuInstrument:
    """The GPU instrument, or on a dry run the CPU census with ``census_options``."""
    return CpuInstrument(**census_options) if dry_run else GpuInstrument()


def timed(
    inst: GpuInstrument | CpuInstrument, fns: dict[str, Callable[[], Any]], *, rounds: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Microseconds per call of each configuration, interleaved (``interleave``), after ``warmup`` calls of each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for name in interleave(list(fns), rounds):
        samples[name].append(inst.time_us(fns[name]))
    return samples
