"""Test infrastructure for the exllamav3 probes: a CPU stand-in for "a tensor on a CUDA device" with host-sync
counting, and CPU references for the sampling kernels.

`Dev` is a torch.Tensor subclass that lives in CPU memory but answers is_cuda = True, so code that branches on
is_cuda takes its CUDA path. Every operation that makes the host wait for device work when the tensor really is on a
GPU is counted in SYNC: reading values (.item(), .tolist(), int(), bool(), .numpy()), moving to the host (.cpu(),
.to("cpu")) and a blocking copy_ from a Dev tensor into a host tensor; torch.cuda.synchronize and CUDA event waits
are counted by the patched torch.cuda functions (install_cuda_mocks). A non-blocking copy_ into a host tensor is
counted as an asynchronous D2H copy, not as a sync. Results of operations on Dev tensors are Dev tensors.

Implicit syncs are counted too: ``if tensor`` (``__bool__``), ``torch.equal`` / ``allclose``, ``nonzero`` /
``argwhere`` / ``masked_select`` / ``unique`` / ``bincount``, ``repeat_interleave`` with tensor repeats and
boolean-mask indexing (read or write). SYNC still misses ``torch.tensor(..., device=)`` (no device exists here) and
anything an extension stand-in does in numpy; the mechanism census (src/overlay/engines/workers/torch_census.py, run
by workers/exllamav3_census.py) counts at the aten level and is the count to trust. ``CensusDev`` is the Dev
the census uses: its ``device`` is ``cpu:0``, so ``x.to(y.device)`` between two device tensors stays on the device and
``host.to(dev.device)`` is an H2D copy, as on a GPU.

The sampling references (install_sampling_references) stand in for the extension's Gumbel-noise and fused-sampler
kernels: a deterministic noise stream keyed on (seed, element index) as the CUDA kernels key Philox, so a stock
call per position and a patched batched call with per-row seeds can be compared bit for bit.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import torch

SYNC: collections.Counter[str] = collections.Counter()

_HOST_READS = {"item", "tolist", "__int__", "__bool__", "__float__", "__index__", "numpy", "cpu"}
# ops whose result shape or value the host must know before it can go on (CUDA syncs for them)
_IMPLICIT = {
    "equal",
    "allclose",
    "nonzero",
    "argwhere",
    "masked_select",
    "unique",
    "unique_consecutive",
    "bincount",
}


def _bool_mask(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _is_host_target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    targets = list(args[1:]) + [kwargs.get("device")]
    for t in targets:
        if isinstance(t, str) and t.startswith("cpu") and ":" not in t:
            return True
        if isinstance(t, torch.device) and t.type == "cpu" and t.index is None:  # cpu:0 is CensusDev's device
            return True
    return False


class Dev(torch.Tensor):  # type: ignore[misc]
    """A CPU tensor posing as a CUDA tensor; host reads are counted in SYNC (see module docstring)."""

    @property
    def is_cuda(self) -> bool:
        return True

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (
            name in _IMPLICIT
            or (name in ("__getitem__", "__setitem__") and len(args) > 1 and _bool_mask(args[1]))
            or (name == "repeat_interleave" and len(args) > 1 and isinstance(args[1], torch.Tensor))
        ):
            SYNC["host_read:" + name] += 1
            return super().__torch_function__(func, types, args, kwargs)
        if name in _HOST_READS:
            SYNC["host_read:" + name] += 1
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            return out
        if name == "to" and _is_host_target(args, kwargs):
            SYNC["host_read:to"] += 1
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).clone()
        if name == "copy_" and len(args) >= 2 and isinstance(args[1], Dev) and not isinstance(args[0], Dev):
            non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
            SYNC["d2h_async" if non_blocking else "host_read:copy_"] += 1
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        return super().__torch_function__(func, types, args, kwargs)


class CensusDev(Dev):
    """A Dev whose ``device`` is ``cpu:0`` (the census's spelling of "the device"; see the module docstring)."""

    @property
    def device(self) -> torch.device:
        return torch.device("cpu", 0)


def dev(t: torch.Tensor) -> Dev:
    d: Dev = t.as_subclass(Dev)
    return d


def host(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind a Dev tensor, without counting (for references and probe bookkeeping)."""
    return t.as_subclass(torch.Tensor) if isinstance(t, Dev) else t


def host_syncs() -> int:
    return sum(v for k, v in SYNC.items() if k.startswith(("host_read:", "wait:")))


class _Event:
    def record(self, stream: Any = None) -> None:
        SYNC["event_record"] += 1

    def synchronize(self) -> None:
        SYNC["wait:event"] += 1

    def query(self) -> bool:
        return True  # CPU work is done when the host sees it


def install_cuda_mocks() -> None:
    """torch.cuda.synchronize / Event / current_stream that count instead of touching a device, and an empty_like
    whose pin_memory=True gives a plain host buffer (the Embedding module's pinned staging)."""

    def synchronize(device: Any = None) -> None:
        SYNC["wait:device_synchronize"] += 1

    if not getattr(torch.empty_like, "_devsim", False):
        empty_like = torch.empty_like

        def host_empty_like(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
            return empty_like(*args, **kwargs)  # no pinned allocator on CPU torch: a plain host buffer

        host_empty_like._devsim = True  # type: ignore[attr-defined]
        torch.empty_like = host_empty_like
    torch.cuda.synchronize = synchronize
    torch.cuda.Event = _Event
    torch.cuda.current_stream = lambda device=None: None


# Noise: uniform (0, 1) from a splitmix64 hash of (seed, index), then Gumbel as the kernels compute it


def _uniform(seed: np.ndarray, index: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (seed.astype(np.uint64) << np.uint64(32)) ^ index.astype(np.uint64)
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    u = (x >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    return np.clip(u, 1e-7, 0.99999994)


def _gumbel(u: np.ndarray) -> np.ndarray:
    g: np.ndarray = -np.log(np.maximum(-np.log(np.maximum(u, 1e-20)), 1e-20))
    return g


def _noise_flat(shape: tuple[int, ...], seed: int) -> np.ndarray:
    n = int(np.prod(shape))
    return _gumbel(_uniform(np.full(n, seed, dtype=np.uint64), np.arange(n))).reshape(shape)


def _noise_rows(rows: int, dim: int, seeds: list[int]) -> np.ndarray:
    s = np.repeat(np.asarray(seeds, dtype=np.uint64), dim)
    i = np.tile(np.arange(dim), rows)
    return _gumbel(_uniform(s, i)).reshape(rows, dim)


def _write(out: torch.Tensor, values: np.ndarray) -> None:
    host(out).copy_(torch.from_numpy(values).to(host(out).dtype))


def install_sampling_references(standin: Any) -> None:
    """CPU references for gumbel_noise_{f16,f32,log} (scalar seed, noise keyed on the flat index), the per-row
    variant gumbel_noise_rows (noise keyed on (seeds[row], column)) when the extension defines it, and
    fused_sampler / fused_sampler_rows modes 0-2 (greedy, Gumbel, Gumbel + min-P)."""
    refs = standin.REFERENCES

    def gumbel(kind: str) -> Any:
        def ref(x_in: torch.Tensor, x_out: torch.Tensor, seed: int) -> None:
            x = host(x_in).double().numpy()
            if kind == "log":
                x = np.log(x)
            _write(x_out, x + _noise_flat(x.shape, seed))

        return ref

    refs["gumbel_noise_f16"] = gumbel("f16")
    refs["gumbel_noise_f32"] = gumbel("f32")
    refs["gumbel_noise_log"] = gumbel("log")

    def gumbel_rows(x_in: torch.Tensor, x_out: torch.Tensor, seeds: list[int], mode: int) -> None:
        x = host(x_in).double().numpy()
        if mode == 2:
            x = np.log(x)
        rows, dim = x.shape
        _write(x_out, x + _noise_rows(rows, dim, seeds))

    refs["gumbel_noise_rows"] = gumbel_rows

    def fused(
        logits: torch.Tensor,
        mask: Any,
        bits: Any,
        out: torch.Tensor,
        workspace: Any,
        size: int,
        inv_temp: float,
        minp_log: float,
        seed: Any,
        mode: int,
        *rest: Any,
    ) -> None:
        if mask is not None or bits is not None or mode == 3:
            raise NotImplementedError("fused_sampler reference: masks and mode 3 are not modelled")
        full = host(logits).double().numpy()
        rows, dim = full.shape
        x = full[:, :size]
        if mode == 0:
            v = x
        else:
            # per-row seeds: noise keyed on (seeds[row], column); scalar seed: on (seed, row * dim + column)
            noise = _noise_rows(rows, dim, seed) if isinstance(seed, list) else _noise_flat((rows, dim), seed)
            v = x * inv_temp + noise[:, :size]
            if mode == 2:
                v = np.where(x >= x.max(axis=1, keepdims=True) + minp_log, v, -np.inf)
        _write(out, np.argmax(v, axis=1).reshape(host(out).shape))

    refs["fused_sampler"] = fused
    refs["fused_sampler_rows"] = lambda logits, mask, bits, out, ws, size, it, ml, seeds, *rest: fused(
        logits, mask, bits, out, ws, size, it, ml, list(seeds), *rest
    )
