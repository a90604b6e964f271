"""What the torch census puts in place of ``torch.cuda`` and around ``torch.distributed`` and the host factories
while it runs: counting ``synchronize`` waits (stand-in Event, Stream and CUDAGraph classes on a CPU-only torch,
wrappers on a CUDA one) and collectives (part of torch_census; runs inside an engine arm, never imports overlay)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch_census_modes import tensors_in
from torch_census_steps import Tape, call_site

if TYPE_CHECKING:
    from torch_census import Census

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


def install(census: Census) -> None:
    """Patch torch for ``census`` (each patch through ``census._patch``, undone when it exits)."""
    _install_cuda(census)
    _install_distributed(census)
    _install_host_factories(census)


def replay(census: Census, tape: Tape) -> None:
    """Replay a captured region as a CUDA graph does: its recorded device ops run again on the tensors they
    read and wrote at capture (uploads re-read their host buffers; host work and host data baked into the
    capture are not redone), counted as the capture's launches (graph-launches) at the caller's line; nothing
    inside is counted again (no syncs, copies, allocations or violations)."""
    census.current.kinds["graph-replays"] += 1
    census._tls.replay_depth += 1
    try:
        for op, args, kwargs, out in tape.ops:
            if op.is_view:
                continue  # the recorded view aliases its base, which the replay rewrites
            fresh = op(*args, **kwargs)
            for dst, src in zip(tensors_in(out), tensors_in(fresh)):
                if dst is not src and dst.shape == src.shape:
                    dst.copy_(src)
    finally:
        census._tls.replay_depth -= 1
    site = call_site()
    for kind, n in sorted(tape.launches.items()):
        census.count("graph-launches", n, kind=kind or None, site=site)


def _install_host_factories(census: Census) -> None:
    for name in ("from_numpy", "frombuffer"):
        original = getattr(torch, name)

        def made_on_host(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            return census.mark_host(_original(*args, **kwargs))

        census._patch(torch, name, made_on_host)


def _install_cuda(census: Census) -> None:
    cuda = torch.cuda

    def synchronize(device: Any = None) -> None:
        census._sync("torch.cuda.synchronize")

    if census.emulate_cuda:
        census._patch(cuda, "synchronize", synchronize)
        census._patch(cuda, "Event", _fake_event(census))
        census._patch(cuda, "Stream", _fake_stream(census))
        stream = _fake_stream(census)()
        census._patch(cuda, "current_stream", lambda device=None: stream)
        census._patch(cuda, "default_stream", lambda device=None: stream)
        census._patch(cuda, "stream", lambda s=None: contextlib.nullcontext(s))
        graph_class = _fake_graph(census)

        def graph_region(graph: Any, *args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[None]:
            tape = None
            if isinstance(graph, graph_class):
                graph.tape = tape = Tape()
            return census.capture(tape=tape)

        census._patch(cuda, "graph", graph_region)
        census._patch(cuda, "CUDAGraph", graph_class)
    else:
        original = cuda.synchronize

        def counted(device: Any = None) -> None:
            census._sync("torch.cuda.synchronize")
            original(device)

        census._patch(cuda, "synchronize", counted)
        for cls in (cuda.Event, cuda.Stream):
            _wrap_method(census, cls, "synchronize", f"{cls.__name__}.synchronize")


def _wrap_method(census: Census, cls: Any, name: str, kind: str) -> None:
    original = getattr(cls, name)

    def counted(obj: Any, *args: Any, **kwargs: Any) -> Any:
        census._sync(kind)
        return original(obj, *args, **kwargs)

    census._patch(cls, name, counted)


def _install_distributed(census: Census) -> None:
    import torch.distributed as dist

    for name in COLLECTIVES:
        if hasattr(dist, name):
            census.wrap(dist, name, "collectives", kind=f"torch.distributed.{name}")


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


def _fake_graph(census: Census) -> type[Any]:
    class CUDAGraph:
        """torch.cuda.CUDAGraph on a CPU run: capture_begin..capture_end (or ``torch.cuda.graph(g)``) is a census
        capture region recorded on the graph's tape; ``replay`` re-runs what it recorded (``Census.replay``)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._region: contextlib.AbstractContextManager[None] | None = None
            self.tape = Tape()

        def capture_begin(self, *args: Any, **kwargs: Any) -> None:
            self.tape = Tape()
            self._region = census.capture(tape=self.tape)
            self._region.__enter__()

        def capture_end(self) -> None:
            if self._region is not None:
                self._region.__exit__(None, None, None)
                self._region = None

        def replay(self) -> None:
            replay(census, self.tape)

        def reset(self) -> None:
            self.tape = Tape()

        def pool(self) -> Any:
            return None

    return CUDAGraph
