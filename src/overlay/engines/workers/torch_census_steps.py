"""The torch census's data: its metrics, one step's counts, the call-site rule and the per-step report (part of
torch_census; runs inside an engine arm, never imports overlay)."""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from census_sites import relative as _relative

METRICS = (
    "host-syncs",
    "h2d-copies",
    "pageable-copies",
    "eager-launches",
    "graph-launches",
    "collectives",
    "bytes-moved",
    "peak-memory",
    "capturable",
    "cache-hits",
    "sort-elements",
    "alloc-bytes",
    "random-elements",
    "gemm-bytes",
)
COUNTED = tuple(m for m in METRICS if m not in ("peak-memory", "capturable"))

_SKIP_FILES = {contextlib.__file__, getattr(sys.modules.get("functools"), "__file__", ""), weakref.__file__}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_HERE = os.path.dirname(os.path.abspath(__file__))
# the census's own modules: a call site is never inside them
CENSUS_FILES = frozenset(
    os.path.join(_HERE, f"{name}.py")
    for name in ("torch_census", "torch_census_steps", "torch_census_modes", "torch_census_stubs")
)


class CaptureViolation(RuntimeError):
    """Raised in a ``capturable()`` region by an operation a CUDA graph cannot capture."""

    def __init__(self, what: str, site: str) -> None:
        super().__init__(f"{what} at {site} inside a capturable region")
        self.what = what
        self.site = site


EXTRA_SKIP: set[str] = set()


def call_site() -> str:
    """The first frame outside torch, the census's modules, contextlib/functools and the files given as
    ``Census(skip=...)`` (a stand-in tensor subclass's module), as ``relative/path.py:LINE``."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (
            name.startswith((_TORCH_DIR, "<frozen"))
            or os.path.abspath(name) in CENSUS_FILES
            or name in _SKIP_FILES
            or name in EXTRA_SKIP
        ):
            return f"{_relative(name)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?:0"


@dataclass
class Step:
    index: int
    tag: str | None = None
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    sites: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    peak: int = 0
    regions: int = 0
    violations: list[str] = field(default_factory=list)

    def capturable(self) -> bool | None:
        return None if self.regions == 0 else not self.violations


class ThreadState(threading.local):
    def __init__(self) -> None:
        self.host_depth = 0
        self.transfer_depth = 0
        self.pin_next = False
        self.kernel_depth = 0
        self.replay_depth = 0


@dataclass
class Tape:
    """What one captured region recorded, as a CUDA graph would hold it: the device ops in order with the tensors
    they read and wrote (``ops``: (op, args, kwargs, out)), and the launches counted while capturing (by kind)."""

    ops: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = field(default_factory=list)
    launches: collections.Counter[str] = field(default_factory=collections.Counter)


def summarize(steps: Sequence[Step]) -> dict[str, Any]:
    """Per-step means of the metrics over ``steps``, call sites summed over them, kinds and violations."""
    n = len(steps)
    metrics: dict[str, Any] = {}
    for m in COUNTED:
        metrics[m] = sum(s.counts[m] for s in steps) / n if n else 0.0
    metrics["peak-memory"] = float(max((s.peak for s in steps), default=0))
    caps = [s.capturable() for s in steps]
    known = [c for c in caps if c is not None]
    metrics["capturable"] = None if not known else all(known)
    sites: dict[str, list[list[Any]]] = {}
    kinds: collections.Counter[str] = collections.Counter()
    for m in COUNTED:
        total: collections.Counter[str] = collections.Counter()
        for s in steps:
            total.update(s.sites.get(m, {}))
        if total:
            sites[m] = [[k, v] for k, v in sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))]
    for s in steps:
        kinds.update(s.kinds)
    return {
        "steps": n,
        "metrics": metrics,
        "sites": sites,
        "kinds": dict(sorted(kinds.items())),
        "per_step": [
            {m: s.counts[m] for m in COUNTED} | {"peak-memory": s.peak, "capturable": s.capturable()}
            for s in steps
        ],
        "violations": [v for s in steps for v in s.violations],
    }
