"""The mlx mechanism census's instrument: hooks on mlx's evaluation, fast kernels and compile that count what one
decode step or speculative round materialises (workers/mlx_lm_census.py drives it through mlx-lm's real call path).
Runs inside an mlx-lm arm; not imported by overlay itself.
"""

from __future__ import annotations

# Counted in mlx-lm's real call path (generate_step, speculative_generate_step), on hooks installed before mlx_lm is
# imported:
# - ops: every mx.eval / mx.async_eval, and every array.item / tolist / __bool__ / __int__ / __float__ (an implicit
#   eval), first writes the graph it is about to materialise with mx.export_to_dot (mlx's own graph export: the
#   unevaluated primitives reachable from the arrays; evaluated arrays are leaves) and counts its primitive nodes.
# - evals: the number of those calls, by call site (file:line and kind); host-syncs: the blocking ones (all but
#   mx.async_eval).
# - Metal: on the CPU backend mlx runs mx.fast.rms_norm / layer_norm / rope / scaled_dot_product_attention as their
#   fallback graphs (many primitives); a Metal build runs each as one kernel. The hooks on mx.fast record which
#   primitive ids each call created, so a graph's count also gives a Metal estimate (fallback primitives collapsed to
#   one per call). mx.compile fuses elementwise primitives on both backends, but it cannot fuse across a Metal fast
#   kernel: the fast calls made while a compiled function was traced are added back, once per call, to the estimate.
#
# Memory, from mlx's own allocator counters (mx.get_active_memory / get_peak_memory / reset_peak_memory; mx.metal.* on
# older mlx), which the CPU backend keeps as the Metal one does (bytes of live buffers, the allocator's free-buffer
# cache excluded):
# - bytes-moved: every counted evaluation is run to completion inside its hook (an mx.async_eval is waited for there:
#   still counted as async, its work just no longer overlaps the next graph's construction), with the peak counter
#   reset before it; its bytes are (peak during it) - (active before it): the new buffers it held at its high-water
#   mark, outputs included. Per step: the sum over the step's evaluations. The export_to_dot graph carries no shapes,
#   hence the allocator. Blind spots: reads (a matmul's weights are not counted), a buffer donated to an elementwise
#   op and written in place (counted once), an intermediate freed before the high-water mark, views (reshape, slice,
#   transpose without a copy: 0 bytes), allocations outside counted evaluations.
# - peak-memory: the allocator's high-water mark over the census steps (bytes, a level: weights, caches and the
#   steps' transients together, both models of a speculative run), not a per-step sum.
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import re
    from collections import Counter
    from collections.abc import Callable

_FAST = ("rms_norm", "layer_norm", "rope", "scaled_dot_product_attention")


class Memory:
    """mlx's allocator counters: the window peak kept across the per-evaluation peak resets of bytes-moved."""

    active: Callable[[], int]
    peak_now: Callable[[], int]
    reset_peak: Callable[[], None]

    def __init__(self, mx: Any) -> None:
        api = mx if hasattr(mx, "get_peak_memory") else mx.metal
        self.active, self.peak_now, self.reset_peak = (
            api.get_active_memory,
            api.get_peak_memory,
            api.reset_peak_memory,
        )
        self.high = 0
        self.intervals: list[int] = []  # the high-water mark between consecutive snapshots

    def fold(self) -> None:
        self.high = max(self.high, self.peak_now(), self.active())

    def restart(self) -> None:
        self.intervals = []
        self.reset_peak()
        self.high = self.active()

    def begin(self) -> int:
        self.fold()
        self.reset_peak()
        return self.active()

    def end(self, start: int) -> int:
        peak = max(self.peak_now(), self.active())
        self.high = max(self.high, peak)
        return max(peak - start, 0)

    def peak(self) -> list[int]:
        """Closes the interval since the previous snapshot; the intervals so far (a snapshot keeps its own copy)."""
        self.fold()
        self.intervals.append(self.high)
        self.reset_peak()
        self.high = self.active()
        return list(self.intervals)


_NODE: re.Pattern[str] | None = None  # compiled regex, set on first use


class Census:
    ops: Counter[str]
    metal: Counter[str]
    fallback: Counter[str]
    evals: Counter[str]
    syncs: Counter[str]
    moved: Counter[str]
    compiled_fast: Counter[str]

    def __init__(self, mx: Any) -> None:
        import re
        from collections import Counter

        global _NODE
        _NODE = re.compile(r'\{ (\d+) \[label ="([^"]*)", shape=rectangle\]; \}')
        self.mx = mx
        self.Counter = Counter
        self.mem = Memory(mx)
        self.streams: list[Any] = []
        self.phase = "main"
        self.tracing = 0
        self.fast_ids: dict[int, tuple[str, int]] = {}  # primitive id -> (label, fast call number)
        self.fast_calls = 0
        self.calls: Counter[str] = Counter()  # model forwards by phase
        self.fast_log: list[str] = []
        self.reset()

    def reset(self) -> None:
        C = self.Counter
        self.ops, self.metal, self.fallback, self.evals, self.syncs = C(), C(), C(), C(), C()
        self.moved = C()  # bytes-moved: per phase, the sum over evaluations of their allocation high-water
        self.mem.restart()
        self.compiled_fast = C()  # fast calls inside compiled functions (Metal runs each as its own kernel)
        self.eval_sites: dict[str, Counter[str]] = {}
        self.op_sites: dict[str, Counter[str]] = {}
        self.prims: dict[str, Counter[str]] = {}
        self.moved_sites: dict[str, Counter[str]] = {}

    def snapshot(self) -> dict[str, Any]:
        import copy

        return copy.deepcopy(
            {
                k: getattr(self, k)
                for k in (
                    "ops",
                    "metal",
                    "fallback",
                    "evals",
                    "syncs",
                    "eval_sites",
                    "op_sites",
                    "prims",
                    "calls",
                    "compiled_fast",
                    "moved",
                    "moved_sites",
                )
            }
        ) | {"peak": self.mem.peak()}

    # graph walking -------------------------------------------------
    def graph(self, arrays: list[Any]) -> list[tuple[int, str]]:
        import io

        arrays = [a for a in arrays if isinstance(a, self.mx.array)]
        if not arrays or self.tracing:
            return []
        buf = io.StringIO()
        self.mx.export_to_dot(buf, *arrays)
        assert _NODE is not None  # set by __init__
        return [(int(i), name) for i, name in _NODE.findall(buf.getvalue())]

    def flatten(self, tree: Any) -> list[Any]:
        out: list[Any] = []
        stack = [tree]
        while stack:
            t = stack.pop()
            if isinstance(t, (list, tuple)):
                stack.extend(t)
            elif isinstance(t, dict):
                stack.extend(t.values())
            elif isinstance(t, self.mx.array):
                out.append(t)
        return out

    def materialise(self, kind: str, arrays: list[Any], depth: int = 2) -> str | None:
        """Counts one evaluation; returns its site (None while a compiled function is traced)."""
        if self.tracing:
            return None
        import sys

        f = sys._getframe(depth)
        site = f"{short(f.f_code.co_filename)}:{f.f_lineno}"
        nodes = self.graph(arrays)
        groups: set[int] = set()
        fallback = 0
        for pid, name in nodes:
            hit = self.fast_ids.pop(pid, None)
            if hit is not None and hit[0] == name:
                fallback += 1
                groups.add(hit[1])
        ph = self.phase
        self.ops[ph] += len(nodes)
        self.fallback[ph] += fallback
        self.metal[ph] += len(nodes) - fallback + len(groups)
        self.evals[ph] += 1
        if kind != "async_eval":
            self.syncs[ph] += 1
        self.eval_sites.setdefault(ph, self.Counter())[f"{site} {kind}"] += 1
        if nodes:
            self.op_sites.setdefault(ph, self.Counter())[site] += len(nodes)
            self.prims.setdefault(ph, self.Counter()).update(name for _, name in nodes)
        return site

    def settle(self) -> None:
        """Waits for every stream (mlx-lm's generation stream included), so the buffers their finished tasks
        release are released before the allocator is read."""
        for stream in (*self.streams, None):
            self.mx.synchronize(stream)

    def evaluate(self, site: str | None, run: Callable[..., Any], *args: Any) -> Any:
        """Runs one counted evaluation to completion and adds the bytes it allocated to ``bytes-moved``."""
        if site is None:
            return run(*args)
        ph = self.phase
        self.settle()
        start = self.mem.begin()
        out = run(*args)
        self.settle()
        moved = self.mem.end(start)
        self.moved[ph] += moved
        if moved:
            self.moved_sites.setdefault(ph, self.Counter())[site] += moved
        return out

    # hooks -------------------------------------------------------------
    def install(self) -> None:
        mx = self.mx
        census = self
        real_eval, real_async = mx.eval, mx.async_eval

        def eval_(*args: Any) -> Any:
            site = census.materialise("eval", census.flatten(args))
            return census.evaluate(site, real_eval, *args)

        def async_eval_(*args: Any) -> Any:
            site = census.materialise("async_eval", census.flatten(args))

            def run_async(
                *a: Any,
            ) -> None:  # waited for here, so its allocations are its own (counted as async all the same)
                real_async(*a)
                real_eval(*a)

            return census.evaluate(site, run_async, *args)

        mx.eval, mx.async_eval = eval_, async_eval_
        for maker in ("new_stream", "new_thread_local_stream"):
            real_maker = getattr(mx, maker, None)
            if real_maker is not None:

                def made(*a: Any, _real: Any = real_maker, **k: Any) -> Any:
                    stream = _real(*a, **k)
                    census.streams.append(stream)
                    return stream

                setattr(mx, maker, made)
        for meth in ("item", "tolist", "__bool__", "__int__", "__float__"):
            real = getattr(mx.array, meth)

            def hooked(self_: Any, *a: Any, _real: Any = real, _kind: str = meth.strip("_"), **k: Any) -> Any:
                site = census.materialise(_kind, [self_])
                return census.evaluate(site, lambda: _real(self_, *a, **k))

            setattr(mx.array, meth, hooked)
        for name in _FAST:
            real_fast = getattr(mx.fast, name, None)
            if real_fast is not None:
                setattr(mx.fast, name, self._fast(name, real_fast))
        real_compile = mx.compile

        def compile_(fun: Callable[..., Any], *a: Any, **k: Any) -> Any:
            fast_in_trace: list[list[str]] = [[]]

            def traced(*args: Any, **kw: Any) -> Any:
                census.tracing += 1
                before = census.fast_log
                census.fast_log = []
                try:
                    return fun(*args, **kw)
                finally:
                    fast_in_trace[0] = census.fast_log
                    census.fast_log = before
                    census.tracing -= 1

            compiled = real_compile(traced, *a, **k)

            class Call:  # an instance, not a function: like mx.compile's result it does not bind as a method
                def __call__(self, *args: Any, **kw: Any) -> Any:
                    out = compiled(*args, **kw)
                    if not census.tracing:
                        census.metal[census.phase] += len(fast_in_trace[0])
                        census.compiled_fast[census.phase] += len(fast_in_trace[0])
                    return out

            return Call()

        mx.compile = compile_

    def _fast(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        census = self

        def fast(*args: Any, **kw: Any) -> Any:
            if census.tracing:
                census.fast_log.append(name)
                return real(*args, **kw)
            before = {pid for pid, _ in census.graph(census.flatten(list(args) + list(kw.values())))}
            out = real(*args, **kw)
            census.fast_calls += 1
            for pid, label in census.graph(census.flatten(out)):
                if pid not in before:
                    census.fast_ids[pid] = (label, census.fast_calls)
            return out

        return fast

    def tag_model(self, model: Any, phase: str) -> Any:
        """Forward calls of ``model`` switch the census phase (target: verify; drafter: draft)."""
        census = self
        cls = type(model)

        def __call__(self_: Any, *a: Any, **k: Any) -> Any:
            census.phase = phase
            census.calls[phase] += 1
            return cls.__call__(self_, *a, **k)

        model.__class__ = type(cls.__name__, (cls,), {"__call__": __call__})
        return model


def short(path: str) -> str:
    marker = "site-packages/"
    return path.split(marker, 1)[1] if marker in path else path.rsplit("/", 1)[-1]
