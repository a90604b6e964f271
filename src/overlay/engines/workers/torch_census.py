"""A census of what a torch engine asks of the device, counted on a CPU run (runs inside an engine arm; never imports
overlay).

``with Census() as c:`` installs a TorchFunctionMode (Python-level tensor calls: ``.tolist()``, ``.cpu()``, ``.to()``,
``.numpy()``, ``pin_memory``), a TorchDispatchMode (every aten op) and counting stand-ins for ``torch.cuda``'s
host-blocking waits and ``torch.distributed``'s collectives. The caller marks steps (``with c.step():``) and, where the
engine would capture a CUDA graph, regions (``with c.capture():``, or ``c.capturable()`` which raises on the first
violation). ``c.report()`` gives per-step means of the metrics named in DESIGN ("Trailers for flags, mechanisms and
dependencies") plus the call sites: the first stack frame outside torch, outside this module and outside
contextlib/functools, as ``relative/path.py:LINE`` (relative to site-packages, else to the working directory).

What "device" means on a CPU run. Every tensor is CPU memory; the census keeps a placement per tensor:
- host: made inside ``c.host()`` or marked by ``c.mark_host(t)``; made pinned (``pin_memory=True``, ``.pin_memory()``,
  which the census emulates on a CPU-only torch and remembers, so ``is_pinned()`` answers True); the result of a host
  read (``.cpu()``, ``.to("cpu")`` of a device tensor); ``torch.tensor``/``as_tensor`` data given without ``device=``
  (Python data lives on the host); ``torch.from_numpy``; the output of an op whose tensor inputs are all host.
- device: anything that answers ``is_cuda`` (a stand-in subclass such as the exllamav3 probes' ``Dev``); made by a
  factory op (zeros, empty, arange, ...) outside a host scope; ``torch.tensor(..., device=X)``; ``.to(X)`` /
  ``.cuda()`` of a host tensor where X is a CUDA device, a CPU device with an index (``cpu:0``) or a device tensor;
  the output of an op with a device input; and (``untracked="device"``, the default) any tensor the census has not
  seen made, e.g. model weights loaded before the census started.
- ``.to(X)`` targets: a CUDA device, ``cpu:N`` or a device tensor mean device; ``"cpu"`` / ``torch.device("cpu")``
  (no index) mean host. A worker that wants ``x.to(y.device)`` between two device tensors read as a no-op gives its
  engine the device ``cpu:0`` or uses a subclass whose ``device`` is ``cpu:0``.

``cpu_is_device=True`` is for an engine whose device *is* spelled ``"cpu"`` (SGLang's CPU engine path): ``.to("cpu")``
of a host tensor and ``torch.tensor(..., device="cpu")`` are H2D copies (on a GPU the same line names the engine's
device), ``.to("cpu")`` of a device tensor stays a D2H read.

``placement="is_cuda"`` replaces the tracking: device memory is exactly what answers ``is_cuda`` (a stand-in subclass),
and ``device_class`` is the subclass an H2D copy's result is given.

Metrics (per step):
- host-syncs: device->host reads of device data (aten ``_local_scalar_dense``: ``.item()``, ``bool()``/``int()``/
  ``float()``/``if`` on a tensor; ``is_nonzero``; every op tagged ``data_dependent_output`` or
  ``dynamic_output_shape``: ``nonzero``, ``torch.equal``, ``allclose``, ``masked_select``, ``unique*``,
  ``repeat_interleave(Tensor)``, ``bincount``, ``argwhere``; ``index`` / ``index_put_`` with a boolean mask;
  ``.tolist()``, ``.numpy()``, ``.cpu()``, blocking ``.to(host)`` and blocking ``copy_`` into a host tensor), blocking
  H2D copies (``non_blocking=False``: CUDA's copy then waits for the stream; ``torch.tensor(..., device=)`` is one),
  and host-blocking waits (``torch.cuda.synchronize``, ``Event.synchronize``, ``Stream.synchronize``).
- h2d-copies / pageable-copies: copies from a host tensor into device memory (``copy_``, ``.to``, ``.cuda()``,
  ``torch.tensor(..., device=)``); pageable unless the source is pinned.
- eager-launches / graph-launches: aten ops with a device input or a device output, outside / inside capture regions,
  excluding views (``OpOverload.is_view``), the metadata and allocation-only ops in ``NON_LAUNCH`` and the ops that
  carry a transfer counted above.
- collectives: calls of the ``torch.distributed`` functions in ``COLLECTIVES``, ``_c10d_functional`` ops, and engine
  entry points wrapped with ``c.wrap(obj, "name", "collectives")``.
- bytes-moved: bytes copied host->device plus device->host (copies and host reads).
- peak-memory: the step's peak of live device bytes allocated by ops during the census (each allocating op's device
  outputs, released by a weakref finalizer when the Python tensor object dies).
- capturable: per step, None without a capture region; False if a region saw a host sync, a data-dependent-shape op or
  a pageable H2D copy (``c.capturable()`` raises CaptureViolation at the first, naming the call site); else True.
- cache-hits: counted only by the worker (``c.count("cache-hits")`` or ``c.wrap``).

Known blind spots (each is tested in tests/census/test_torch_census.py where a test can show it):
- Only the thread that entered the Census is seen by the modes (torch mode stacks are per thread); the patched
  ``torch.cuda`` / ``torch.distributed`` functions count in every thread.
- A function imported by name before the census (``from torch.distributed import all_reduce``,
  ``from torch.cuda import synchronize``) is not patched and not counted.
- Work done in C++ without dispatching aten ops (custom extension kernels, stand-ins implemented in numpy) is not seen;
  an extension stand-in's Python entry points can be wrapped with ``c.wrap(module, name, "eager-launches")``.
- ``x.to(torch.device("cpu"))`` meant as "stay on the device" reads as a D2H host read (see the targets above); a
  host buffer made by a factory with ``device="cpu"`` outside a host scope reads as device memory.
- Peak memory counts only allocations made while the census runs, per Python tensor object: a view kept alive after
  its base's Python object died under-counts, and the caching allocator's reserve is not modelled.
- With ``cpu_is_device``, ``.to("cpu")`` of a host tensor meant as "stay on the host" reads as an H2D copy, and host
  metadata made by a factory (``device="cpu"``) reads as device memory, so its ``.tolist()`` counts as a sync (the same
  over-count in both arms); an engine that gates pinning on an availability check (SGLang's
  ``is_pin_memory_available()``) takes its unpinned CPU branch, so its copies count as pageable.
- The modes see only the process that entered the Census: an engine's scheduler subprocess needs its own (SGLang:
  workers/sglang_census_hook.py, loaded as an SGLang plugin).
- A CPU torch has no streams: ``non_blocking=True`` copies are counted as asynchronous (not syncs) as on CUDA, but no
  ordering between streams is modelled.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from census_sites import relative as _relative
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary

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
)
COUNTED = tuple(m for m in METRICS if m not in ("peak-memory", "capturable"))

_aten = torch.ops.aten
NON_LAUNCH = {
    "detach",
    "lift_fresh",
    "alias",
    "empty",
    "empty_strided",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "_local_scalar_dense",
    "set_",
    "resize_",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_nonzero",
    "_nested_tensor_from_mask_left_aligned",
    "is_same_size",
    "_has_compatible_shallow_copy_type",
    "record_stream",
}
SYNC_OPS = {"_local_scalar_dense", "is_nonzero"}
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "reduce",
    "gather",
    "scatter",
)
_DEVICE_FACTORIES = frozenset(
    {"zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like", "empty_like", "full_like"}
)
_FACTORIES_WITH_DATA = {"tensor", "as_tensor"}
_SKIP_FILES = {contextlib.__file__, getattr(sys.modules.get("functools"), "__file__", ""), weakref.__file__}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS = os.path.abspath(__file__)


class CaptureViolation(RuntimeError):
    """Raised in a ``capturable()`` region by an operation a CUDA graph cannot capture."""

    def __init__(self, what: str, site: str) -> None:
        super().__init__(f"{what} at {site} inside a capturable region")
        self.what = what
        self.site = site


_EXTRA_SKIP: set[str] = set()


def call_site() -> str:
    """The first frame outside torch, this module, contextlib/functools and the files given as ``Census(skip=...)``
    (a stand-in tensor subclass's module), as ``relative/path.py:LINE``."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (
            name.startswith((_TORCH_DIR, "<frozen"))
            or os.path.abspath(name) == _THIS
            or name in _SKIP_FILES
            or name in _EXTRA_SKIP
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


class _State(threading.local):
    def __init__(self) -> None:
        self.host_depth = 0
        self.transfer_depth = 0
        self.pin_next = False
        self.kernel_depth = 0


class Census:
    """Count host syncs, transfers, launches, collectives and memory per step (see the module docstring)."""

    def __init__(
        self,
        *,
        untracked: str = "device",
        placement: str = "tracked",
        device_class: type | None = None,
        emulate_cuda: bool | None = None,
        skip: tuple[str, ...] = (),
        cpu_is_device: bool = False,
    ) -> None:
        if untracked not in ("device", "host"):
            raise ValueError(f"untracked={untracked!r}: expected 'device' or 'host'")
        if placement not in ("tracked", "is_cuda"):
            raise ValueError(f"placement={placement!r}: expected 'tracked' or 'is_cuda'")
        self.untracked = untracked
        self.placement = placement
        self.device_class = device_class
        self.skip = tuple(skip)
        self.cpu_is_device = cpu_is_device
        self.emulate_cuda = (not torch.cuda.is_available()) if emulate_cuda is None else emulate_cuda
        self._place: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self._tls = _State()
        self.steps: list[Step] = []
        self._outside = Step(-1)
        self._current: Step | None = None
        self._capture_depth = 0
        self._strict_depth = 0
        self._check_depth = 0
        self._live = 0
        self._patches: list[tuple[Any, str, Any]] = []
        self._modes: list[Any] = []

    # --- placement

    def is_device(self, t: torch.Tensor) -> bool:
        if getattr(t, "is_cuda", False):
            return True
        if self.placement == "is_cuda":
            return False
        place = self._place.get(t)
        if place is not None:
            return bool(place == "device")
        return self.untracked == "device"

    def is_pinned(self, t: torch.Tensor) -> bool:
        return self._place.get(t) == "pinned"

    def mark_host(self, t: torch.Tensor, *, pinned: bool = False) -> torch.Tensor:
        self._place[t] = "pinned" if pinned else "host"
        return t

    def mark_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.placement == "is_cuda" and not getattr(t, "is_cuda", False) and self.device_class is not None:
            t = t.as_subclass(self.device_class)
        self._place[t] = "device"
        return t

    @contextlib.contextmanager
    def host(self) -> Iterator[None]:
        """Tensors made inside are host memory, and ops on them are host work (no launches)."""
        self._tls.host_depth += 1
        try:
            yield
        finally:
            self._tls.host_depth -= 1

    # --- steps and regions

    @property
    def current(self) -> Step:
        return self._current if self._current is not None else self._outside

    @contextlib.contextmanager
    def step(self, tag: str | None = None) -> Iterator[Step]:
        """One step of the scenario; ``tag`` names its kind when one run holds several (``report(tag=...)``)."""
        s = Step(len(self.steps), tag=tag, peak=self._live)
        self.steps.append(s)
        self._current = s
        try:
            yield s
        finally:
            self._current = None

    @contextlib.contextmanager
    def resume(self, step: Step) -> Iterator[Step]:
        """Count into an earlier step again (a step made of two calls, e.g. a forward and its result processing)."""
        saved, self._current = self._current, step
        try:
            yield step
        finally:
            self._current = saved

    @contextlib.contextmanager
    def capture(self, *, strict: bool = False) -> Iterator[None]:
        """A region the engine would capture as a CUDA graph: its ops count as graph-launches."""
        self.current.regions += 1
        self._capture_depth += 1
        self._strict_depth += int(strict)
        try:
            yield
        finally:
            self._capture_depth -= 1
            self._strict_depth -= int(strict)

    @contextlib.contextmanager
    def capture_check(self) -> Iterator[None]:
        """A region judged for capturability (as ``capture``) whose ops still count as eager-launches: for code a
        patch makes capturable that no engine region captures yet in this census."""
        self.current.regions += 1
        self._check_depth += 1
        try:
            yield
        finally:
            self._check_depth -= 1

    def capturable(self) -> contextlib.AbstractContextManager[None]:
        """A capture region that raises CaptureViolation on the first operation a CUDA graph cannot capture."""
        return self.capture(strict=True)

    # --- counting

    def count(self, metric: str, n: int = 1, *, kind: str | None = None, site: str | None = None) -> None:
        if metric not in COUNTED:
            raise ValueError(f"unknown census metric {metric!r}; expected one of {', '.join(COUNTED)}")
        step = self.current
        where = site or call_site()
        step.counts[metric] += n
        step.sites[metric][where] += n
        if kind:
            step.kinds[f"{metric}:{kind}"] += n

    def _violation(self, what: str, site: str) -> None:
        if self._capture_depth == 0 and self._check_depth == 0:
            return
        self.current.violations.append(f"{what} at {site}")
        if self._strict_depth:
            raise CaptureViolation(what, site)

    def _sync(self, kind: str, nbytes: int = 0) -> None:
        site = call_site()
        self.count("host-syncs", kind=kind, site=site)
        if nbytes:
            self.current.counts["bytes-moved"] += nbytes
        self._violation(f"host sync ({kind})", site)

    def _h2d(self, src: torch.Tensor, nbytes: int, *, blocking: bool, how: str) -> None:
        site = call_site()
        self.count("h2d-copies", kind=how, site=site)
        self.current.counts["bytes-moved"] += nbytes
        if not self.is_pinned(src):
            self.count("pageable-copies", kind=how, site=site)
            self._violation(f"pageable H2D copy ({how})", site)
        if blocking:
            self.count("host-syncs", kind=f"blocking-h2d:{how}", site=site)
            self._violation(f"blocking H2D copy ({how})", site)

    @contextlib.contextmanager
    def kernel(self, name: str) -> Iterator[None]:
        """One device kernel (a stand-in for a compiled extension op, written in torch): counted as one launch at the
        caller's line; the ops, host reads and copies the stand-in makes inside are not counted (a GPU runs one
        kernel there), but placements and allocations are kept."""
        self.count("graph-launches" if self._capture_depth else "eager-launches", kind=f"kernel:{name}")
        self._tls.kernel_depth += 1
        try:
            yield
        finally:
            self._tls.kernel_depth -= 1

    def wrap_kernels(self, module: Any) -> dict[Any, Any]:
        """Count each public function of a kernel stand-in ``module`` as one launch (``kernel``), also where another
        module bound it by name; returns {original: wrapper} for bindings the caller knows of."""
        import types

        wrappers: dict[Any, Any] = {}
        census = self
        for name, fn in list(vars(module).items()):
            if (
                name.startswith("_")
                or not isinstance(fn, types.FunctionType)
                or fn.__module__ != module.__name__
            ):
                continue

            def run(
                *args: Any, _fn: Any = fn, _name: str = f"{module.__name__}.{name}", **kwargs: Any
            ) -> Any:
                with census.kernel(_name):
                    return _fn(*args, **kwargs)

            wrappers[fn] = run
            self._patch(module, name, run)
        for other in list(sys.modules.values()):
            space = getattr(other, "__dict__", None)
            if other is module or not isinstance(space, dict):
                continue
            for key, value in list(space.items()):
                if isinstance(value, types.FunctionType) and value in wrappers:
                    self._patch(other, key, wrappers[value])
        return wrappers

    def wrap(self, obj: Any, name: str, metric: str, *, kind: str | None = None) -> None:
        """Count every call of ``obj.name`` as one ``metric`` (restored when the census exits)."""
        original = getattr(obj, name)
        census = self

        def counted(*args: Any, **kwargs: Any) -> Any:
            census.count(metric, kind=kind or name)
            return original(*args, **kwargs)

        self._patch(obj, name, counted)

    def _patch(self, obj: Any, name: str, value: Any) -> None:
        self._patches.append(
            (obj, name, obj.__dict__.get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING)
        )
        setattr(obj, name, value)

    def _alloc(self, out: torch.Tensor) -> None:
        n = out.untyped_storage().nbytes() if out.numel() else 0
        if not n:
            return
        self._live += n
        step = self.current
        step.peak = max(step.peak, self._live)
        weakref.finalize(out, self._free, n)

    def _free(self, n: int) -> None:
        self._live -= n

    # --- install / uninstall

    def __enter__(self) -> Census:
        _EXTRA_SKIP.update(self.skip)
        self._install_cuda()
        self._install_distributed()
        self._install_host_factories()
        fmode, dmode = _FunctionMode(self), _DispatchMode(self)
        fmode.__enter__()
        dmode.__enter__()
        self._modes = [fmode, dmode]
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(None, None, None)
        self._modes = []
        for obj, name, old in reversed(self._patches):
            if old is _MISSING:
                with contextlib.suppress(AttributeError, TypeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, old)
        self._patches = []

    def _install_host_factories(self) -> None:
        census = self
        for name in ("from_numpy", "frombuffer"):
            original = getattr(torch, name)

            def made_on_host(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                return census.mark_host(_original(*args, **kwargs))

            self._patch(torch, name, made_on_host)

    def _install_cuda(self) -> None:
        census = self
        cuda = torch.cuda

        def synchronize(device: Any = None) -> None:
            census._sync("torch.cuda.synchronize")

        if self.emulate_cuda:
            self._patch(cuda, "synchronize", synchronize)
            self._patch(cuda, "Event", _fake_event(self))
            self._patch(cuda, "Stream", _fake_stream(self))
            stream = _fake_stream(self)()
            self._patch(cuda, "current_stream", lambda device=None: stream)
            self._patch(cuda, "default_stream", lambda device=None: stream)
            self._patch(cuda, "stream", lambda s=None: contextlib.nullcontext(s))
            self._patch(cuda, "graph", lambda graph, *a, **k: census.capture())
            self._patch(cuda, "CUDAGraph", _fake_graph(self))
        else:
            original = cuda.synchronize

            def counted(device: Any = None) -> None:
                census._sync("torch.cuda.synchronize")
                original(device)

            self._patch(cuda, "synchronize", counted)
            for cls in (cuda.Event, cuda.Stream):
                self._wrap_method(cls, "synchronize", f"{cls.__name__}.synchronize")

    def _wrap_method(self, cls: Any, name: str, kind: str) -> None:
        original = getattr(cls, name)
        census = self

        def counted(obj: Any, *args: Any, **kwargs: Any) -> Any:
            census._sync(kind)
            return original(obj, *args, **kwargs)

        self._patch(cls, name, counted)

    def _install_distributed(self) -> None:
        import torch.distributed as dist

        for name in COLLECTIVES:
            if hasattr(dist, name):
                self.wrap(dist, name, "collectives", kind=f"torch.distributed.{name}")

    # --- results

    def report(self, *, skip: int = 0, tag: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """Per-step means of the metrics (the steps tagged ``tag``, or all, after the first ``skip``), call sites
        summed over those steps, kinds and violations."""
        steps = [s for s in self.steps if tag is None or s.tag == tag][skip:]
        steps = steps[:limit] if limit is not None else steps
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


_MISSING = object()


def _device_target(census: Census, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    """For ``Tensor.to(...)``: True (device), False (host) or None (no device given: a dtype conversion)."""
    candidates = [kwargs.get("device"), kwargs.get("other"), *args[1:]]
    for c in candidates:
        if isinstance(c, torch.Tensor):
            return census.is_device(c)
        if isinstance(c, int) and not isinstance(c, bool):
            return True
        if isinstance(c, str):
            c = torch.device(c)
        if isinstance(c, torch.device):
            return c.type != "cpu" or c.index is not None
    return None


def _on_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a ``Tensor.to`` call with every device spelled as the CPU (a CPU torch has no other)."""

    def fix(a: Any) -> Any:
        if isinstance(a, (str, torch.device)) or (isinstance(a, int) and not isinstance(a, bool)):
            return torch.device("cpu")
        return a

    return (args[0], *[fix(a) for a in args[1:]]), {
        k: (fix(v) if k == "device" else v) for k, v in kwargs.items()
    }


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


class _FunctionMode(TorchFunctionMode):
    """Python-level calls a CPU torch does not dispatch: host reads, ``.to``, pinning, data factories."""

    def __init__(self, census: Census) -> None:
        super().__init__()
        self.c = census

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        c = self.c
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name == "is_pinned" and src is not None:
            return c.is_pinned(src)
        if name == "pin_memory" and src is not None:
            with c.host():
                out = src.clone()
            return c.mark_host(out, pinned=True)
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
            with c.host():
                out = func(*args, **kwargs)
            for t in _tensors(out):
                c.mark_host(t, pinned=True)
            return out
        if c._tls.kernel_depth:
            return func(*args, **kwargs)
        if name in _FACTORIES_WITH_DATA and func in (torch.tensor, torch.as_tensor):
            device = kwargs.get("device")
            with c.host():
                out = func(*args, **{k: v for k, v in kwargs.items() if k != "device"})
            c.mark_host(out)
            data = args[0] if args else None
            if isinstance(data, torch.Tensor) and func is torch.as_tensor and device is None:
                return data
            if device is None or (_device_target(c, (None, device), {}) is False and not c.cpu_is_device):
                return out
            c._h2d(out, out.nbytes, blocking=True, how=f"torch.{name}(device=)")
            with c.host():
                dev = out.clone()
            return c.mark_device(dev)
        if src is None:
            out = func(*args, **kwargs)
            if (
                c.placement == "is_cuda"
                and c.device_class is not None
                and name in _DEVICE_FACTORIES
                and getattr(torch, name, None) is func
                and kwargs.get("device") is not None
                and _device_target(c, (None, kwargs["device"]), {}) is True
                and isinstance(out, torch.Tensor)
                and not getattr(out, "is_cuda", False)
            ):
                out = c.mark_device(out)  # device memory made by a factory (device= the device's spelling)
            return out
        if name in ("tolist", "numpy", "__array__"):
            if c.is_device(src):
                c._sync(f"Tensor.{name}", src.nbytes)
            return func(*args, **kwargs)
        if name in ("cpu", "cuda", "to"):
            target = False if name == "cpu" else True if name == "cuda" else _device_target(c, args, kwargs)
            if name == "to" and target is False and c.cpu_is_device:
                target = not c.is_device(src)  # the engine's device is spelled "cpu": host -> it is an upload
            if target is None or target == c.is_device(src):
                if name == "cuda":
                    return src
                return func(*args, **kwargs)
            non_blocking = bool(kwargs.get("non_blocking", False))
            if target:
                c._h2d(src, src.nbytes, blocking=not non_blocking, how=f"Tensor.{name}")
            elif non_blocking:
                c.count("bytes-moved", src.nbytes, kind="d2h-async")
            else:
                c._sync(f"Tensor.{name}", src.nbytes)
            c._tls.transfer_depth += 1
            try:
                if name == "cuda":
                    out = src.clone()
                else:
                    cargs, ckw = _on_cpu(args, kwargs)
                    out = func(*cargs, **ckw)
                    if out is src:
                        out = src.clone()
            finally:
                c._tls.transfer_depth -= 1
            if target:
                c._alloc(out)
            return c.mark_device(out) if target else c.mark_host(out)
        return func(*args, **kwargs)


class _DispatchMode(TorchDispatchMode):
    """Every aten op: host syncs by op, copies between placements, launches, allocations."""

    def __init__(self, census: Census) -> None:
        super().__init__()
        self.c = census

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        c = self.c
        kwargs = kwargs or {}
        name = func._schema.name.split("::", 1)[-1]
        ns = func.namespace
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        in_host_scope = c._tls.host_depth > 0
        any_device = not in_host_scope and any(c.is_device(t) for t in inputs)
        tags = set(func.tags)
        in_kernel = c._tls.kernel_depth > 0
        if any_device and not c._tls.transfer_depth and not in_kernel:
            if name in SYNC_OPS or torch.Tag.data_dependent_output in tags:
                nbytes = inputs[0].element_size() if name == "_local_scalar_dense" else 0
                c._sync(f"aten.{name}", nbytes)
            elif torch.Tag.dynamic_output_shape in tags or name == "index_put_":
                masked = any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1:]))
                if name not in ("index", "index_put_") or masked:
                    site = call_site()
                    c.count("host-syncs", kind=f"aten.{name}", site=site)
                    c._violation(f"data-dependent shape (aten.{name})", site)
            if name == "copy_" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
                dst, src = args[0], args[1]
                non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
                dst_dev, src_dev = c.is_device(dst), c.is_device(src)
                if dst_dev and not src_dev:
                    c._h2d(src, src.nbytes, blocking=not non_blocking, how="copy_")
                elif src_dev and not dst_dev:
                    if non_blocking:
                        c.count("bytes-moved", src.nbytes, kind="d2h-async")
                    else:
                        c._sync("copy_ to host", src.nbytes)
        out = func(*args, **kwargs)
        if ns in ("_c10d_functional", "c10d") and not in_kernel:
            c.count("collectives", kind=f"{ns}.{name}")
            return out
        is_factory = not inputs
        device_out = not in_host_scope and (any_device or (is_factory and c.untracked == "device"))
        if name == "copy_" and len(inputs) >= 2:
            if (
                c.is_device(inputs[0])
                and c.is_device(inputs[1])
                and not in_host_scope
                and not c._tls.transfer_depth
                and not in_kernel
            ):
                c.count("graph-launches" if c._capture_depth else "eager-launches", kind="aten.copy_")
            return out
        outs = list(_tensors(out))
        if not func.is_view and name not in ("copy_",):
            for t in outs:
                if device_out:
                    c.mark_device(t)
                else:
                    c.mark_host(t)
        elif func.is_view and inputs:
            base = "device" if c.is_device(inputs[0]) else ("pinned" if c.is_pinned(inputs[0]) else "host")
            for t in outs:
                c._place[t] = base
        if (
            device_out
            and not c._tls.transfer_depth
            and not in_kernel
            and not func.is_view
            and name not in NON_LAUNCH
        ):
            c.count("graph-launches" if c._capture_depth else "eager-launches", kind=f"aten.{name}")
        if (
            device_out
            and not c._tls.transfer_depth
            and not func.is_view
            and torch.Tag.inplace not in tags
            and not name.endswith("_")
        ):
            for t in outs:
                c._alloc(t)
        return out


def _fake_event(census: Census) -> type:
    class Event:
        """torch.cuda.Event on a CPU run: ``synchronize`` is a counted host-blocking wait."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record(self, stream: Any = None) -> None:
            pass

        def wait(self, stream: Any = None) -> None:
            pass  # a device-side wait: the host does not block

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            census._sync("Event.synchronize")

        def elapsed_time(self, other: Any) -> float:
            return 0.0

    return Event


def _fake_stream(census: Census) -> type:
    class Stream:
        """torch.cuda.Stream on a CPU run: ``synchronize`` is a counted host-blocking wait."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def synchronize(self) -> None:
            census._sync("Stream.synchronize")

        def wait_stream(self, other: Any) -> None:
            pass

        def wait_event(self, event: Any) -> None:
            pass

        def record_event(self, event: Any = None) -> Any:
            return event

        def query(self) -> bool:
            return True

        def __enter__(self) -> Stream:
            return self

        def __exit__(self, *exc: Any) -> None:
            pass

    return Stream


def _fake_graph(census: Census) -> type:
    class CUDAGraph:
        """torch.cuda.CUDAGraph on a CPU run: capture_begin..capture_end is a census capture region."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._region: contextlib.AbstractContextManager[None] | None = None

        def capture_begin(self, *args: Any, **kwargs: Any) -> None:
            self._region = census.capture()
            self._region.__enter__()

        def capture_end(self) -> None:
            if self._region is not None:
                self._region.__exit__(None, None, None)
                self._region = None

        def replay(self) -> None:
            census.current.kinds["graph-replays"] += 1

        def reset(self) -> None:
            pass

        def pool(self) -> Any:
            return None

    return CUDAGraph


def run_counted(fn: Callable[[], Any], census: Census) -> Any:
    """Run ``fn`` as one census step; return its result."""
    with census.step():
        return fn()
