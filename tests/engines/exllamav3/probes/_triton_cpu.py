"""TEST INFRASTRUCTURE: upstream's Triton paged-attention kernels on CPU, run by Triton's interpreter.

``paged_attn_triton_decode`` and ``paged_attn_triton_prefill`` (exllamav3/modules/attention_fn/triton_paged.py) are the
kernels SlidingAttention's window path calls; with ``TRITON_INTERPRET=1`` (``enable``, before triton is imported)
Triton runs them on the host, program by program in numpy. The kernels and their Python wrappers are upstream's,
unchanged: they read and write the pages through the block table and sequence lengths the ring code hands them, so a
wrong table, length or window shows in their outputs. Their arithmetic is the interpreter's (numpy), not a GPU's: the
probes compare them with an unbounded reference within a tolerance, and across arms (stock linear buffers, patched
rings) bit for bit.

Stood in, because no CUDA device exists here (``install``):
- the wrappers' argument checks want CUDA tensors: tensors go in as ``_devsim.Dev`` (CPU memory answering
  ``is_cuda``) and results come back as plain tensors;
- device queries (``torch.cuda.device``, ``current_device``, ``get_device_capability``, ``get_device_properties``):
  an sm_90 device with 132 SMs and 227 KiB of opt-in shared memory per block (an H100/H200); they choose the split
  count and tile ladder only;
- ``smem.pick_config``: the first candidate of each tile ladder (the stock config; upstream's note: on a full-budget
  device the first candidate always fits), since the interpreter has no compile-only warm-up to measure a footprint.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

SM90 = types.SimpleNamespace(
    name="sm_90 (stand-in)",
    major=9,
    minor=0,
    multi_processor_count=132,
    shared_memory_per_block_optin=232448,
    shared_memory_per_block=49152,
)
KERNELS = ("paged_attn_triton_decode", "paged_attn_triton_prefill")


def enable() -> None:
    os.environ["TRITON_INTERPRET"] = "1"


def _to_dev(x: Any) -> Any:
    import torch
    from _devsim import Dev

    return x.as_subclass(Dev) if isinstance(x, torch.Tensor) and not isinstance(x, Dev) else x


def _wrap(fn: Any) -> Any:
    def interpreted(*args: Any, **kwargs: Any) -> Any:
        import torch

        out = fn(*(_to_dev(a) for a in args), **{k: _to_dev(v) for k, v in kwargs.items()})
        return out.as_subclass(torch.Tensor) if isinstance(out, torch.Tensor) else out

    interpreted._ovl_interpreted = True  # type: ignore[attr-defined]
    return interpreted


def install(*modules: Any) -> None:
    """Point each module's paged-attention kernels (names imported from triton_paged) at upstream's, interpreted."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "enable() must run before triton is imported"
    import torch
    from exllamav3.modules.attention_fn import smem, triton_paged

    torch.cuda.device = lambda device=None: contextlib.nullcontext()
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda device=None: (SM90.major, SM90.minor)
    torch.cuda.get_device_properties = lambda device=None: SM90
    smem.pick_config = lambda device, name, key, candidates, probe: candidates[0]
    triton_paged.pick_config = smem.pick_config
    for module in modules:
        for name in KERNELS:
            if hasattr(module, name):
                setattr(module, name, _wrap(getattr(triton_paged, name)))
