"""The ring probes' shared references (test infrastructure): attention over explicit key rows, the visible window of a
query position, and a torch stand-in for the paged decode kernel (``paged_attn_triton_decode``) that appends and reads
rows exactly through the block table and sequence lengths it is given (swa_ring.py, mixed_ring.py,
shared_kv_ring.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

PAGE = 256
HQ, HKV = 4, 2

# (packed rows, scales, bits) -> fp rows: how a quantized ring's pages are read back
Dequant = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def attend(
    q: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], scale: float
) -> torch.Tensor:
    """One query position (HQ, D) over its visible key rows (each (HKV, D)), fp32 math, fp16 out."""
    k = torch.stack(list(keys)).float().repeat_interleave(HQ // HKV, dim=1)
    v = torch.stack(list(values)).float().repeat_interleave(HQ // HKV, dim=1)
    s = torch.einsum("hd,nhd->hn", q.float(), k) * scale
    return torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v).half()


def visible(qpos: int, end: int, left: int, right: int) -> range:
    """The key positions query ``qpos`` sees: ``left`` back, ``right`` ahead (a negative bound: unbounded), below
    ``end``."""
    lo = 0 if left < 0 else max(0, qpos - left)
    hi = end if right < 0 else min(end, qpos + right + 1)
    return range(lo, hi)


def decode_reference(dequant: Dequant | None = None, head_dim: int = 16) -> Callable[..., torch.Tensor]:
    """A reference for ``paged_attn_triton_decode``: append the step's k/v rows (when given) at cache_seqlens through
    the block table, then each query row attends over the rows before it and its own (``window_size``; causal: none
    ahead), the query rows being the last ones. With ``qc`` (packed quantized pages: scales and bits), the step's
    ``pre_appended_len`` rows are already in the cache and the pages are read back through ``dequant``
    (``head_dim`` wide per KV head)."""

    def ref_decode(
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        bt: torch.Tensor,
        cache_seqlens: torch.Tensor,
        causal: bool = True,
        softmax_scale: float | None = None,
        window_size: tuple[int, int] | None = (-1, -1),
        softcap: float = 0.0,
        sinks: Any = None,
        max_kv_len: int | None = None,
        qc: tuple[torch.Tensor, torch.Tensor, int, int] | None = None,
        pre_appended_len: int = 0,
        **_: Any,
    ) -> torch.Tensor:
        bsz, qlen = q.shape[:2]
        out = torch.empty_like(q)
        left, right = window_size if window_size is not None else (-1, -1)
        right = 0 if causal else right
        assert softmax_scale is not None, "the layers always pass their scale"
        scale = float(softmax_scale)
        for b in range(bsz):
            base = int(cache_seqlens[b])
            rows = (
                k.shape[1] if k is not None else pre_appended_len
            )  # the step's rows (k/v, or already in qc)
            end = base + rows
            assert end <= bt.shape[1] * PAGE, f"read past the block table: {end} > {bt.shape[1] * PAGE}"
            if qc is None and k is not None and v is not None:
                for r in range(rows):
                    page = int(bt[b, (base + r) // PAGE])
                    k_pages[page, (base + r) % PAGE].copy_(k[b, r])
                    v_pages[page, (base + r) % PAGE].copy_(v[b, r])
            pages = bt[b].long()[torch.arange(end) // PAGE]
            at = torch.arange(end) % PAGE
            if qc is None:
                all_k, all_v = k_pages[pages, at], v_pages[pages, at]
            else:
                assert dequant is not None, "a quantized ring needs its dequant"
                sk, sv, kb, vb = qc
                all_k = dequant(k_pages[pages, at], sk[pages, at], kb).view(end, HKV, head_dim)
                all_v = dequant(v_pages[pages, at], sv[pages, at], vb).view(end, HKV, head_dim)
            for r in range(qlen):
                span = visible(end - qlen + r, end, left, right)
                out[b, r] = attend(
                    q[b, r], list(all_k[span.start : span.stop]), list(all_v[span.start : span.stop]), scale
                )
        return out

    return ref_decode


def attention_kernels(payload: dict[str, Any], ref_decode: Callable[..., torch.Tensor], *modules: Any) -> Any:
    """Choose the probe's attention path in the exllamav3 modules given (``sliding_attn``, ``shared_kv_attn``).

    ``"kernels": "reference"`` (the default, CPU): each module's ``paged_attn_triton_decode`` is the torch reference
    and the graphed C++ decode step (BC) is off: it runs the layer's own projections and kernels, which the probes
    replace. ``"real"`` (a GPU): upstream's Triton kernels; with ``"graphed": true`` the graphed path is left as
    upstream sets it (``EXL3_BC_ATTN``, on by default), else off. ``"interpret"`` (CPU): upstream's Triton kernels
    run by Triton's interpreter (_triton_cpu; the probe sets TRITON_INTERPRET=1 before importing exllamav3), the
    graphed path off. Returns a function giving how many decode steps the
    graphed path served so far (``SlidingAttention.bc_swa_step`` / ``SharedKVAttention._bc_step`` returning an
    output): a served step ran the layer's real projections, so the probes compare it across arms, never with their
    unbounded reference. The graphed path needs EXL3-quantized projections (bc_attn._module_eligible); the probes'
    fp16 layers are declined, which the count shows."""
    kernels = payload.get("kernels", "reference")
    real = kernels == "real"
    graphed = real and bool(payload.get("graphed"))
    if kernels == "interpret":
        import _triton_cpu

        _triton_cpu.install(*modules)
    for module in modules:
        if kernels == "reference":
            module.paged_attn_triton_decode = ref_decode
        if graphed:
            from exllamav3.modules.attention_fn import bc_attn

            module._bc_attn_enable = bc_attn.bc_attn_enable  # upstream's switch (EXL3_BC_ATTN)
        else:
            module._bc_attn_enable = False
        for cls_name, method in (("SlidingAttention", "bc_swa_step"), ("SharedKVAttention", "_bc_step")):
            cls = getattr(module, cls_name, None)
            original = getattr(cls, method, None) if cls is not None else None
            if original is None or getattr(original, "_ovl_counted", False):
                continue

            def counted(self: Any, *args: Any, _orig: Any = original, **kwargs: Any) -> Any:
                out = _orig(self, *args, **kwargs)
                _GRAPHED_SERVED[0] += out is not None
                return out

            counted._ovl_counted = True  # type: ignore[attr-defined]
            setattr(cls, method, counted)
    start = _GRAPHED_SERVED[0]
    return lambda: _GRAPHED_SERVED[0] - start


_GRAPHED_SERVED = [
    0
]  # graphed decode steps served in this process (one counter: several cases share the classes)
