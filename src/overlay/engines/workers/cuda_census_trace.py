"""The GPU census's pure parts (part of cuda_census; no torch needed, so CPU tests import them): call sites,
``parse_trace`` (a chrome trace -> counts, kinds, launch sites), ``interleave`` (ABBA order of timed calls over
several configurations), ``ratio_interval`` (median times and a bootstrap interval of their ratio)."""

from __future__ import annotations

import collections
import contextlib
import os
import random
import re
import statistics
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

import census_sites
from census_sites import relative

COUNTED = (
    "host-syncs",
    "h2d-copies",
    "pageable-copies",
    "eager-launches",
    "graph-launches",
    "collectives",
    "bytes-moved",
    "cache-hits",
    "gemm-bytes",
)
# census_sites.GEMM_OPS as the profiler names them; bytes per element of the profiler's "Input type" names
GEMM_OPS = frozenset(f"aten::{name}" for name in census_sites.GEMM_OPS)
ITEMSIZE = {
    "double": 8,
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
}
_HERE = os.path.dirname(os.path.abspath(__file__))
# the GPU census's own modules: a call site is never inside them
CENSUS_FILES = frozenset(os.path.join(_HERE, f"{name}.py") for name in ("cuda_census", "cuda_census_trace"))
_PY_FRAME = re.compile(r"^(?P<file>.+?\.py)\((?P<line>\d+)\): ")
GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_v10000")


def torch_dir_path() -> str:
    try:
        import torch

        return str(os.path.dirname(torch.__file__)) + os.sep
    except ImportError:  # pure helpers only
        return os.sep + "torch" + os.sep


def _skipped(path: str, torch_dir: str) -> bool:
    return (
        path.startswith((torch_dir, "<"))
        or os.path.abspath(path) in CENSUS_FILES
        or path in (contextlib.__file__, warnings.__file__)
        or "/torch/" in path.replace(os.sep, "/")
    )


def call_site(torch_dir: str | None = None) -> str:
    """The first frame outside torch, the GPU census's modules, contextlib and warnings, as ``relative/path.py:LINE``."""
    torch_dir = torch_dir or torch_dir_path()
    frame = sys._getframe(1)
    while frame is not None:
        if not _skipped(frame.f_code.co_filename, torch_dir):
            return f"{relative(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?:0"


def exception_site(exc: BaseException, torch_dir: str | None = None) -> str:
    """The deepest frame of ``exc``'s traceback outside torch and the GPU census's modules."""
    torch_dir = torch_dir or torch_dir_path()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _skipped(f.filename, torch_dir)]
    return f"{relative(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?:0"


# --- pure helpers --------------------------------------------------------------------------------------------------


def parse_trace(doc: dict[str, Any], *, torch_dir: str | None = None) -> dict[str, Any]:
    """Counts of one profiled step from its chrome trace (``torch.profiler`` ``export_chrome_trace``).

    Returns ``{"counts": {metric: n}, "kinds": {"metric:kind": n}, "sites": {metric: {site: n}}}`` with
    eager-launches / graph-launches (kernels and memsets, by the ``cudaGraphLaunch`` correlation), h2d-copies,
    pageable-copies (``Memcpy HtoD (Pageable -> Device)``), bytes-moved (HtoD + DtoH memcpy bytes), gemm-bytes (the
    operand bytes of the matrix-multiply ``cpu_op`` events, which need ``record_shapes=True``)."""
    torch_dir = torch_dir or torch_dir_path()
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    by_corr = {(e.get("args") or {}).get("correlation"): e for e in runtime}
    graph_corr = {(e.get("args") or {}).get("correlation") for e in runtime if e.get("name") in GRAPH_LAUNCH}
    py = sorted(
        (e for e in events if e.get("cat") == "python_function"), key=lambda e: (e.get("tid"), e["ts"])
    )
    py_by_tid: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in py:
        py_by_tid[e.get("tid")].append(e)
    counts: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    sites: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def site_of(corr: Any) -> str:
        launch = by_corr.get(corr)
        if launch is None:
            return "?:0"
        return site_at(launch) or f"runtime:{launch.get('name')}"

    def site_at(event: dict[str, Any]) -> str | None:
        t = float(event["ts"])
        enclosing = [
            p
            for p in py_by_tid.get(event.get("tid"), [])
            if float(p["ts"]) <= t <= float(p["ts"]) + float(p.get("dur", 0))
        ]
        enclosing.sort(key=lambda p: float(p.get("dur", 0)))  # innermost first
        for p in enclosing:
            m = _PY_FRAME.match(str(p.get("name", "")))
            if m and not _skipped(m.group("file"), torch_dir):
                return f"{relative(m.group('file'))}:{m.group('line')}"
        return None

    # a matrix multiply run inside another (torch's CPU _scaled_mm dequantizes and calls mm) is part of the outer one
    gemms = sorted(
        (e for e in events if e.get("cat") == "cpu_op" and e.get("name") in GEMM_OPS),
        key=lambda e: (str(e.get("tid")), float(e["ts"]), -float(e.get("dur", 0))),
    )
    inner: set[int] = set()
    open_end: dict[Any, float] = {}
    for e in gemms:
        start, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        if start < open_end.get(e.get("tid"), float("-inf")):
            inner.add(id(e))
        else:
            open_end[e.get("tid")] = end
    for e in events:
        cat, name, args = e.get("cat"), str(e.get("name", "")), e.get("args") or {}
        corr = args.get("correlation")
        if cat in ("kernel", "gpu_memset"):
            metric = "graph-launches" if corr in graph_corr else "eager-launches"
            counts[metric] += 1
            kinds[f"{metric}:{'memset' if cat == 'gpu_memset' else name[:80]}"] += 1
            sites[metric][site_of(corr)] += 1
        elif cat == "gpu_memcpy":
            nbytes = int(args.get("bytes", 0) or 0)
            if "HtoD" in name:
                counts["h2d-copies"] += 1
                sites["h2d-copies"][site_of(corr)] += 1
                if "Pageable" in name:
                    counts["pageable-copies"] += 1
                    sites["pageable-copies"][site_of(corr)] += 1
                counts["bytes-moved"] += nbytes
                kinds[f"bytes-moved:{'h2d'}"] += nbytes
            elif "DtoH" in name:
                counts["bytes-moved"] += nbytes
                kinds["bytes-moved:d2h"] += nbytes
            kinds[f"memcpy:{name[:60]}"] += 1
        elif cat == "cpu_op" and name in GEMM_OPS and id(e) not in inner:
            nbytes = gemm_operand_bytes(args)
            counts["gemm-bytes"] += nbytes
            kinds[f"gemm-bytes:{name[6:]}"] += nbytes
            sites["gemm-bytes"][site_at(e) or f"op:{name}"] += nbytes
    return {"counts": dict(counts), "kinds": dict(kinds), "sites": {m: dict(c) for m, c in sites.items()}}


def gemm_operand_bytes(args: dict[str, Any]) -> int:
    """The operand bytes of one matrix-multiply ``cpu_op`` of a trace recorded with ``record_shapes=True``: each
    tensor input's elements (``Input Dims``; a 0-dim scale is one) times its ``Input type``'s size, as the CPU
    census's ``gemm_operand_bytes`` (a non-tensor argument has no known type and is skipped)."""
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    total = 0
    for shape, dtype in zip(dims, types):
        size = ITEMSIZE.get(str(dtype))
        if size is None or not isinstance(shape, list):
            continue
        n = 1
        for d in shape:
            n *= int(d)
        total += n * size
    return total


def interleave(names: Sequence[str], rounds: int) -> list[str]:
    """The order of timed calls: every name once per round, each round reversing the last (ABBA...), so drift in
    clocks or caches falls on every configuration alike."""
    order: list[str] = []
    for r in range(rounds):
        order += list(names) if r % 2 == 0 else list(reversed(names))
    return order


def ratio_interval(
    stock: Sequence[float], patched: Sequence[float], *, reps: int = 2000, level: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """Medians and ``ratio = median(stock) / median(patched)`` (> 1: the patched side is faster), with a bootstrap
    percentile interval of the ratio (resampling each side)."""
    if not stock or not patched:
        return {
            "stock_us": None,
            "patched_us": None,
            "ratio": None,
            "ci": None,
            "n": [len(stock), len(patched)],
        }
    ms, mp = statistics.median(stock), statistics.median(patched)
    rng = random.Random(seed)
    ratios = []
    for _ in range(reps):
        s = statistics.median(rng.choices(stock, k=len(stock)))
        p = statistics.median(rng.choices(patched, k=len(patched)))
        if p > 0:
            ratios.append(s / p)
    ratios.sort()
    lo = ratios[int((1 - level) / 2 * (len(ratios) - 1))] if ratios else None
    hi = ratios[int((1 + level) / 2 * (len(ratios) - 1))] if ratios else None
    return {
        "stock_us": round(ms, 3),
        "patched_us": round(mp, 3),
        "ratio": round(ms / mp, 4) if mp > 0 else None,
        "ci": [round(lo, 4), round(hi, 4)] if lo is not None and hi is not None else None,
        "level": level,
        "n": [len(stock), len(patched)],
    }
