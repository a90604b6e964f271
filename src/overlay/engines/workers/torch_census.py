"""A census of what a torch engine asks of the device, counted on a CPU run (runs inside an engine arm; never imports
overlay).

``with Census() as c:`` installs a TorchFunctionMode (Python-level tensor calls: ``.tolist()``, ``.cpu()``, ``.to()``,
``.numpy()``, ``pin_memory``), a TorchDispatchMode (every aten op) and counting stand-ins for ``torch.cuda``'s
host-blocking waits and ``torch.distributed``'s collectives. The caller marks steps (``with c.step():``) and, where the
engine would capture a CUDA graph, regions (``with c.capture():``, or ``c.capturable()`` which raises on the first
violation). ``c.report()`` gives per-step means of the metrics named in DESIGN ("Trailers for flags, mechanisms and
dependencies") plus the call sites: the first stack frame outside torch, outside the census's modules and outside
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

``expand=("multinomial", ...)`` names aten ops whose kernel is itself a sequence of aten ops written in C++ for every
device (``multinomial_out``: its validity checks, then the exponential race), which the dispatch mode sees as one op: each
call is run under torch's profiler and its direct sub-ops are counted as the launches (random elements, allocated
bytes) a GPU runs for it, at the caller's line (kind ``aten.SUB``, plus ``expanded:aten.OP`` per call); allocation-only sub-ops are not
launches and the ``.item()`` a CPU ``_assert_async`` does inside is not a host read (on CUDA it is a device-side assert).

``placement="is_cuda"`` replaces the tracking: device memory is what answers ``is_cuda`` (a stand-in subclass), and
``device_class`` is the subclass an H2D copy's result is given. A tensor ATen makes in C++ within one Python call is a
plain Tensor there (the view ``out[..., 0::2] = y`` writes through, einsum's or ``matmul``'s reshaped bmm operands): it
is device memory if the op that made it had a device input, so such a write is one device copy kernel and such a bmm
one device GEMM. A host read's result (``.cpu()``, whose subclass method returns the tensor itself) is a plain host
tensor.

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
  excluding views (``OpOverload.is_view``), the metadata and allocation-only ops in ``NON_LAUNCH`` (with
  ``_unsafe_view``: an alias ATen does not tag as a view, made by ``matmul`` and by ``reshape`` after its copy; it is no
  allocation either) and the ops that carry a transfer counted above. On a CPU-only torch, ``torch.cuda.CUDAGraph``
  and ``torch.cuda.graph(g)`` are emulated: the capture region records its device ops on the graph (a ``Tape``), and
  ``g.replay()`` runs them again on the same tensors (an upload re-reads its host buffer, as a captured copy does; host
  work and values baked at capture are not redone) and counts the capture's launches as graph-launches at the
  replay's line.
- collectives: calls of the ``torch.distributed`` functions in ``COLLECTIVES``, ``_c10d_functional`` ops, and engine
  entry points wrapped with ``c.wrap(obj, "name", "collectives")``.
- bytes-moved: bytes copied host->device plus device->host (copies and host reads).
- peak-memory: the step's peak of live device bytes allocated by ops during the census (each allocating op's device
  outputs, released by a weakref finalizer when the Python tensor object dies).
- capturable: per step, None without a capture region; False if a region saw a host sync, a data-dependent-shape op or
  a pageable H2D copy (``c.capturable()`` raises CaptureViolation at the first, naming the call site); else True.
- cache-hits: counted only by the worker (``c.count("cache-hits")`` or ``c.wrap``).
- alloc-bytes: the step's device bytes allocated by ops, summed whether or not they are freed within the step (the
  same allocations as peak-memory): each is written at least once, so a vocabulary-wide temporary counts its bytes
  where peak-memory sees it only if it sets the step's peak.
- sort-elements: elements of the inputs of the full sorts (``aten.sort``, ``argsort`` goes through it) among the
  eager- and graph-launches above: a sort's work grows as n log n where a ``topk`` or a reduction reads n once.
- random-elements: elements written by the random-sampling ops in ``RANDOM_OPS`` (``exponential_``, ``uniform_``,
  ``rand``, ``randint``, ``multinomial``, ...) among the eager- and graph-launches above: the random numbers a step
  draws through torch's generators. Noise an extension kernel derives inside C++ (vLLM's ``fused_gumbel_argmax``
  hashes a seed per token) is not seen; only the seeds it is given are.
- gemm-bytes: bytes of the tensor operands (every input but ``out=``: matrices, bias, scales, each view's elements
  times their size) of the matrix-multiply ops in ``GEMM_OPS`` (``mm``, ``addmm``, ``bmm``, ``_scaled_mm``, ...;
  ``matmul`` / ``linear`` reach dispatch as these) among the eager- and graph-launches above: at decode batch sizes a
  GEMM's time is reading its weight, so the weight's dtype width shows here. A GEMM inside an extension kernel (a
  stand-in's torch ops) is not seen.

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
- A replay re-runs only the aten ops the capture dispatched: work a capture region did outside aten (a numpy stand-in
  for an extension kernel) is not replayed, so such a replay's outputs are stale (a worker that cannot rule this out
  does not trust its launch counts).
- ``x.new_tensor(data)`` (Python data onto x's device: an H2D copy on CUDA) is not counted as a copy, in any
  placement (``torch.tensor(data, device=)`` is).
- With ``placement="is_cuda"``, a factory without ``device=`` (``torch.zeros(3)``: host memory, plain) still counts its
  launch and its bytes in alloc-bytes / peak-memory (the factory rule above), though later ops on it are host work; and
  a ``*_like`` / ``new_*`` of a device tensor given ``device="cpu"`` answers is_cuda (the stand-in subclass wraps every
  result), so a host buffer made that way reads as device memory.
- A CPU torch has no streams: ``non_blocking=True`` copies are counted as asynchronous (not syncs) as on CUDA, but no
  ordering between streams is modelled.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch_census_stubs
from torch.utils.weak import WeakTensorKeyDictionary
from torch_census_modes import DispatchMode, FunctionMode
from torch_census_steps import (
    COUNTED,
    EXTRA_SKIP,
    METRICS,
    CaptureViolation,
    Step,
    Tape,
    ThreadState,
    call_site,
    summarize,
)

__all__ = ["COUNTED", "METRICS", "CaptureViolation", "Census", "Step", "call_site", "run_counted"]

_MISSING = object()


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
        expand: tuple[str, ...] = (),
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
        self.expand = frozenset(expand)
        self.emulate_cuda = (not torch.cuda.is_available()) if emulate_cuda is None else emulate_cuda
        self._place: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self._tls = ThreadState()
        self.steps: list[Step] = []
        self._outside = Step(-1)
        self._current: Step | None = None
        self._capture_depth = 0
        self._strict_depth = 0
        self._check_depth = 0
        self._tape: Tape | None = None
        self._live = 0
        self._patches: list[tuple[Any, str, Any]] = []
        self._modes: list[Any] = []

    # --- placement

    def is_device(self, t: torch.Tensor) -> bool:
        if getattr(t, "is_cuda", False):
            return True
        place = self._place.get(t)
        if self.placement == "is_cuda":
            # a tensor made in C++ within one Python call (the view a slice assignment writes through, einsum's bmm
            # operands) is a plain Tensor: it has the placement the dispatch mode gave it, else it is host memory
            return bool(place == "device")
        if place is not None:
            return bool(place == "device")
        return self.untracked == "device"

    def is_pinned(self, t: torch.Tensor) -> bool:
        return bool(self._place.get(t) == "pinned")

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
    def capture(self, *, strict: bool = False, tape: Tape | None = None) -> Iterator[None]:
        """A region the engine would capture as a CUDA graph: its ops count as graph-launches; with ``tape`` (the
        emulated CUDAGraph's) its device ops are also recorded there for the graph's replay."""
        self.current.regions += 1
        self._capture_depth += 1
        self._strict_depth += int(strict)
        saved = self._tape
        if tape is not None:
            self._tape = tape
        try:
            yield
        finally:
            self._tape = saved
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
        if metric == "graph-launches" and self._tape is not None:
            self._tape.launches[kind or ""] += n
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
        self.count("alloc-bytes", n)
        step = self.current
        step.peak = max(step.peak, self._live)
        weakref.finalize(out, self._free, n)

    def _free(self, n: int) -> None:
        self._live -= n

    # --- install / uninstall

    def __enter__(self) -> Census:
        EXTRA_SKIP.update(self.skip)
        torch_census_stubs.install(self)
        fmode, dmode = FunctionMode(self), DispatchMode(self)
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

    # --- results

    def report(self, *, skip: int = 0, tag: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """Per-step means of the metrics (the steps tagged ``tag``, or all, after the first ``skip``), call sites
        summed over those steps, kinds and violations."""
        steps = [s for s in self.steps if tag is None or s.tag == tag][skip:]
        steps = steps[:limit] if limit is not None else steps
        return summarize(steps)


def run_counted(fn: Callable[[], Any], census: Census) -> Any:
    """Run ``fn`` as one census step; return its result."""
    with census.step():
        return fn()
