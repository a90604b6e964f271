"""TEST INFRASTRUCTURE: the extension's quantized-cache format with upstream's own decoder, for the CPU stand-in.

The decoder is not ours: it is upstream's Triton loader `_qc_load_v` (exllamav3/modules/attention_fn/triton_paged.py,
the code the real paged-attention kernels read a quantized cache with), run by Triton's CPU interpreter
(TRITON_INTERPRET=1, which must be set before exllamav3 is imported: see `enable`), and upstream's rotation matrix
`_get_h32`. It fixes the format: per token and KV head, head_dim / 32 groups; each group rotated by H32 (orthonormal,
1/sqrt(32) included) and stored as `bits` int32 words of power-of-two bit planes (widths 8, 4, 2, 1 of the set bits
of `bits`, high bits first; a plane of width W holds 32 / W values per word) plus one fp16 scale; a value decodes as
(q - m + 1/2) * scale / m with m = 2^(bits - 1), still in the rotated domain (the kernels rotate the query instead).

The encoder is the only part written here, as the inverse that format implies (what q_cache_kernels.cuh computes:
scale = group absmax of the rotated values, q = floor(v / scale * m + m) clamped to [0, 2m - 1]); `codec_check`
verifies it against upstream's decoder (every decoded value within half a grid step of the rotated input).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import triton.language as tl

PAGE = 256
_KERNEL = None


def enable() -> None:
    os.environ["TRITON_INTERPRET"] = "1"


def _h32() -> torch.Tensor:
    from exllamav3.modules.attention_fn.triton_paged import _get_h32

    return _get_h32("cpu").float()


def _planes(bits: int) -> list[tuple[int, int]]:
    """(width, shift) of each bit plane, in the decoder's order (high bits first)"""
    widths = [w for w in (8, 4, 2, 1) if bits & w]
    out, shift = [], bits
    for w in widths:
        shift -= w
        out.append((w, shift))
    return out


def quant_rows(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (..., dim) fp16, dim a multiple of 32 -> words (..., dim // 32 * bits) int32, scales (..., dim // 32) fp16"""
    lead, dim = x.shape[:-1], x.shape[-1]
    g = x.reshape(-1, 32).float() @ _h32()
    m = 1 << (bits - 1)
    scale = g.abs().amax(dim=-1).half()
    s = scale.float().clamp_min(1e-30).unsqueeze(-1)
    q = torch.floor(g / s * m + m).clamp(0, 2 * m - 1).to(torch.int64)  # (groups, 32)
    words = []
    for w, shift in _planes(bits):
        vpw = 32 // w
        vals = ((q >> shift) & ((1 << w) - 1)).view(-1, w, vpw)  # value d = j * vpw + k -> word j, lane k
        word = (vals << (torch.arange(vpw, dtype=torch.int64) * w)).sum(-1)  # (groups, w)
        words.append(word)
    packed = torch.cat(words, dim=-1)  # (groups, bits)
    packed = torch.where(packed >= (1 << 31), packed - (1 << 32), packed).to(torch.int32)
    return packed.reshape(*lead, dim // 32 * bits), scale.reshape(*lead, dim // 32)


def _kernel() -> Any:
    global _KERNEL, _qc_load_v, tl
    if _KERNEL is None:
        import triton
        import triton.language as tl  # the interpreter resolves a kernel's names in this module's globals
        from exllamav3.modules.attention_fn.triton_paged import _qc_load_v

        @triton.jit  # type: ignore[untyped-decorator]
        def _dequant(  # type: ignore[no-untyped-def]
            qwords,
            scales,
            out,
            n_rows,
            BITS: tl.constexpr,
            n_kv_heads: tl.constexpr,
            head_dim: tl.constexpr,
            BLOCK_N: tl.constexpr,
        ):
            h = tl.program_id(0)
            rows = tl.arange(0, BLOCK_N)
            mask = rows < n_rows
            offs_d = tl.arange(0, head_dim)
            tile = _qc_load_v(qwords, scales, rows, h, offs_d, mask, BITS, n_kv_heads, head_dim, head_dim)
            tl.store(
                out + rows[:, None] * (n_kv_heads * head_dim) + h * head_dim + offs_d[None, :],
                tile,
                mask=mask[:, None],
            )

        _KERNEL = _dequant
    return _KERNEL


def dequant_rotated(words: torch.Tensor, scale: torch.Tensor, bits: int, n_kv_heads: int) -> torch.Tensor:
    """Upstream's decode: words (n, dim // 32 * bits), scales (n, dim // 32) -> (n, dim) fp16, rotated domain"""
    n = words.shape[0]
    dim = scale.shape[-1] * 32
    out = torch.zeros((n, dim), dtype=torch.half)
    if n:
        block = 1 << max(0, (n - 1).bit_length())
        _kernel()[(n_kv_heads,)](
            words.contiguous(),
            scale.contiguous(),
            out,
            n,
            bits,
            n_kv_heads,
            dim // n_kv_heads,
            max(block, 16),
        )
    return out


def dequant_rows(words: torch.Tensor, scale: torch.Tensor, bits: int, n_kv_heads: int) -> torch.Tensor:
    """Upstream's decode, rotated back to the original domain (what attention over the rotated keys and a rotated
    query computes): (..., dim) fp16"""
    lead = words.shape[:-1]
    rot = dequant_rotated(
        words.reshape(-1, words.shape[-1]), scale.reshape(-1, scale.shape[-1]), bits, n_kv_heads
    )
    return (rot.float().view(-1, 32) @ _h32()).half().reshape(*lead, -1)


def codec_check(
    gen: torch.Generator, bits: int, n_kv_heads: int, head_dim: int, rows: int = 64
) -> dict[str, Any]:
    """The encoder against upstream's decoder: decoded values (rotated domain) vs the rotated input, in units of
    half a grid step (scale / 2m); <= 1 (plus fp16 rounding) when the encoder writes the format the decoder reads"""
    x = torch.randn(rows, n_kv_heads * head_dim, generator=gen).half()
    x[:, 3] *= 8  # an outlier channel
    words, scale = quant_rows(x, bits)
    got = dequant_rotated(words, scale, bits, n_kv_heads).float().view(-1, 32)
    want = x.float().view(-1, 32) @ _h32()
    step = scale.float().view(-1, 1) / (1 << (bits - 1)) / 2
    err = (got - want).abs() / step
    back = dequant_rows(words, scale, bits, n_kv_heads).float()
    rel = float((back - x.float()).norm() / x.float().norm())
    return {"max_half_steps": float(err.max()), "rel_l2": rel}


def quant_cache_paged(
    k_in: Any,
    k_out: Any,
    k_sc: Any,
    v_in: Any,
    v_out: Any,
    v_sc: Any,
    cache_seqlens: Any,
    block_table: Any,
    page_size: Any,
    seq_len: Any,
    compand_a: Any,
    in_contiguous: Any,
) -> None:
    kb = k_out.shape[-1] // k_sc.shape[-1]
    vb = v_out.shape[-1] // v_sc.shape[-1]
    for b in range(block_table.shape[0]):
        base = int(cache_seqlens[b])
        for r in range(seq_len):
            page, row = int(block_table[b, (base + r) // PAGE]), (base + r) % PAGE
            kw, ks = quant_rows(k_in[b, r].reshape(-1), kb)
            vw, vs = quant_rows(v_in[b, r].reshape(-1), vb)
            k_out[page, row], k_sc[page, row], v_out[page, row], v_sc[page, row] = kw, ks, vw, vs


def make_dequant_cache_paged(n_kv_heads: int) -> Any:
    def dequant_cache_paged(
        k_in: Any,
        k_sc: Any,
        k_out: Any,
        v_in: Any,
        v_sc: Any,
        v_out: Any,
        cache_seqlens: Any,
        block_table: Any,
        page_size: Any,
        sliding_window: Any,
        compand_a: Any,
    ) -> None:
        kb = k_in.shape[-1] // k_sc.shape[-1]
        vb = v_in.shape[-1] // v_sc.shape[-1]
        for b in range(block_table.shape[0]):
            n = int(cache_seqlens[b])
            if n == 0:
                continue
            pages = block_table[b].long()[torch.arange(n) // PAGE]
            rows = torch.arange(n) % PAGE
            k = dequant_rows(k_in[pages, rows], k_sc[pages, rows], kb, n_kv_heads)
            v = dequant_rows(v_in[pages, rows], v_sc[pages, rows], vb, n_kv_heads)
            k_out[pages, rows] = k.view(n, *k_out.shape[2:])
            v_out[pages, rows] = v.view(n, *v_out.shape[2:])

    return dequant_cache_paged


def install(standin_module: Any, n_kv_heads: int) -> None:
    standin_module.REFERENCES["quant_cache_paged"] = quant_cache_paged
    standin_module.REFERENCES["dequant_cache_paged"] = make_dequant_cache_paged(n_kv_heads)
