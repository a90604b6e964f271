"""The torch census's two torch modes: a TorchFunctionMode for the Python-level tensor calls a CPU torch does not
dispatch (host reads, ``.to``, pinning, data factories) and a TorchDispatchMode for every aten op (part of
torch_census; runs inside an engine arm, never imports overlay)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from census_sites import GEMM_OPS
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch_census_steps import call_site

if TYPE_CHECKING:
    from torch_census import Census

NON_LAUNCH = {
    "detach",
    "lift_fresh",
    "alias",
    "empty",
    "empty_strided",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "_unsafe_view",  # a view without alias annotations (matmul, reshape of a copy): no kernel, no memory
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
_DEVICE_FACTORIES = frozenset(
    {"zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like", "empty_like", "full_like"}
)
_FACTORIES_WITH_DATA = {"tensor", "as_tensor"}
# the ops that draw from a torch generator (random-elements counts the elements they write)
RANDOM_OPS = frozenset(
    {
        "exponential_",
        "uniform_",
        "normal_",
        "bernoulli_",
        "random_",
        "cauchy_",
        "log_normal_",
        "geometric_",
        "exponential",
        "uniform",
        "normal",
        "bernoulli",
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "multinomial",
        "poisson",
    }
)


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


_NOT_LAUNCHED_INSIDE = NON_LAUNCH | {"as_strided", "view", "reshape", "_reshape_alias", "resize_"}


def _expanded(c: Census, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run an op of ``Census(expand=...)`` under torch's profiler and count its direct sub-ops as eager launches
    (random ops also as random-elements, from their first input's shape) at the caller's line."""
    from torch.autograd.profiler import profile

    name = func._schema.name.split("::", 1)[-1]
    with profile(record_shapes=True, profile_memory=True) as prof:
        out = func(*args, **kwargs)
    top = [e for e in prof.function_events if e.cpu_parent is None and e.name == f"aten::{name}"]
    site = call_site()
    c.current.kinds[f"expanded:aten.{name}"] += 1
    for child in top[0].cpu_children if top else []:
        sub = child.name.split("::", 1)[-1]
        if (
            sub not in ("empty", "resize_") and child.cpu_memory_usage > 0
        ):  # those two make the op's own output
            c.count("alloc-bytes", int(child.cpu_memory_usage), site=site)
        if sub in _NOT_LAUNCHED_INSIDE:
            continue
        c.count("eager-launches", kind=f"aten.{sub}", site=site)
        if sub in RANDOM_OPS and child.input_shapes and child.input_shapes[0]:
            n = 1
            for d in child.input_shapes[0]:
                n *= int(d)
            c.count("random-elements", n, kind=f"aten.{sub}", site=site)
    return out


def gemm_operand_bytes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes a matrix-multiply op reads: every tensor operand (the matrices, a bias, scales), each as its view's
    elements times their size (a transposed weight is read whole once), not the ``out=`` buffer it writes."""
    operands = list(tensors_in(args)) + list(tensors_in({k: v for k, v in kwargs.items() if k != "out"}))
    return sum(t.numel() * t.element_size() for t in operands)


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from tensors_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from tensors_in(x)


class FunctionMode(TorchFunctionMode):  # type: ignore[misc]  # torch is untyped here
    """Python-level calls a CPU torch does not dispatch: host reads, ``.to``, pinning, data factories."""

    def __init__(self, census: Census) -> None:
        super().__init__()
        self.c = census

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        c = self.c
        kwargs = dict(kwargs or {})
        if c._tls.replay_depth:
            return func(*args, **kwargs)
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
            for t in tensors_in(out):
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
            elif c.placement == "is_cuda" and getattr(out, "is_cuda", False):
                # the read's result is host memory (the subclass's own .cpu() returns the tensor itself)
                out = out.as_subclass(torch.Tensor)
            return c.mark_device(out) if target else c.mark_host(out)
        return func(*args, **kwargs)


def _fills_a_mask(c: Census, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``x[mask] = scalar`` as ATen runs it: ``index_put_`` with one bool/uint8 index, no accumulate and a one-element
    value on the host is dispatched to ``masked_fill_`` (``can_dispatch_to_masked_fill``, TensorAdvancedIndexing), which
    reads no mask count back; any other value (a device tensor, several elements) takes ``nonzero`` and syncs."""
    if name != "index_put_" or len(args) < 3 or not isinstance(args[2], torch.Tensor):
        return False
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    indices = [i for i in args[1] if i is not None]
    value = args[2]
    return (
        not accumulate
        and len(indices) == 1
        and indices[0].dtype in (torch.bool, torch.uint8)
        and value.numel() == 1
        and not c.is_device(value)
    )


class DispatchMode(TorchDispatchMode):  # type: ignore[misc]
    """Every aten op: host syncs by op, copies between placements, launches, allocations."""

    def __init__(self, census: Census) -> None:
        super().__init__()
        self.c = census

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        c = self.c
        kwargs = kwargs or {}
        if c._tls.replay_depth:
            return func(*args, **kwargs)
        name = func._schema.name.split("::", 1)[-1]
        ns = func.namespace
        inputs = list(tensors_in(args)) + list(tensors_in(kwargs))
        in_host_scope = c._tls.host_depth > 0
        any_device = not in_host_scope and any(c.is_device(t) for t in inputs)
        tags = set(func.tags)
        in_kernel = c._tls.kernel_depth > 0
        if any_device and not c._tls.transfer_depth and not in_kernel:
            if name in SYNC_OPS or torch.Tag.data_dependent_output in tags:
                nbytes = inputs[0].element_size() if name == "_local_scalar_dense" else 0
                c._sync(f"aten.{name}", nbytes)
            elif torch.Tag.dynamic_output_shape in tags or name == "index_put_":
                masked = any(t.dtype in (torch.bool, torch.uint8) for t in tensors_in(args[1:]))
                if (name not in ("index", "index_put_") or masked) and not _fills_a_mask(
                    c, name, args, kwargs
                ):
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
        expanded = (
            name in c.expand
            and any_device
            and not c._tls.transfer_depth
            and not in_kernel
            and not c._capture_depth
        )
        out = _expanded(c, func, args, kwargs) if expanded else func(*args, **kwargs)
        if c._tape is not None and not in_host_scope and (any_device or c._tls.transfer_depth or not inputs):
            c._tape.ops.append((func, args, kwargs, out))  # device work a CUDA graph would hold
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
        outs = list(tensors_in(out))
        if not func.is_view and name not in ("copy_",):
            # on the output object itself (mark_device's is_cuda subclass would be a new object C++ never sees); under
            # placement="is_cuda" a factory's output is device memory only if it answers is_cuda (device= factories)
            device_made = device_out and (any_device or c.placement != "is_cuda")
            for t in outs:
                c._place[t] = "device" if device_made else "host"
        elif func.is_view and inputs:
            base = "device" if c.is_device(inputs[0]) else ("pinned" if c.is_pinned(inputs[0]) else "host")
            if name == "lift_fresh" and inputs[0] not in c._place:
                base = "host"  # a tensor made in C++ from Python data (x[mask] = 0.0's value): host memory on CUDA too
            for t in outs:
                c._place[t] = base
        if (
            device_out
            and not expanded
            and not c._tls.transfer_depth
            and not in_kernel
            and not func.is_view
            and name not in NON_LAUNCH
        ):
            c.count("graph-launches" if c._capture_depth else "eager-launches", kind=f"aten.{name}")
            if name == "sort":
                c.count("sort-elements", inputs[0].numel(), kind="aten.sort")
            elif name in RANDOM_OPS:
                c.count("random-elements", sum(t.numel() for t in outs), kind=f"aten.{name}")
            elif name in GEMM_OPS:
                c.count("gemm-bytes", gemm_operand_bytes(args, kwargs), kind=f"aten.{name}")
        if (
            device_out
            and not c._tls.transfer_depth
            and not func.is_view
            and name != "_unsafe_view"
            and getattr(torch.Tag, "inplace", None) not in tags  # torch 2.11 has no inplace tag
            and not name.endswith("_")
        ):
            for t in outs:
                c._alloc(t)
        return out
