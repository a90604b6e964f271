"""TEST INFRASTRUCTURE: the extension's quantized-cache format with upstream's own decoder, for the CPU stand-in.

The decoder is not ours: it is upstream's Triton loader `_qc_load_v` (exllamav3/modules/attention_fn/triton_paged.py,
the code the real paged-attention kernels read a quantized cache with), run by Triton's CPU interpreter
(TRITON_INTERPRET=1, which must be set before exllamav3 is imported: see `enable`). It fixes the format: per token and
KV head, head_dim / 32 groups; each group rotated by H32 (Sylvester order, 1/sqrt(32)) and stored as `bits` int32
words of power-of-two bit planes (widths 8, 4, 2, 1 of the set bits of `bits`, high bits first; a plane of width W
holds 32 / W values per word) plus one fp16 scale; a value decodes as (q - m + 1/2) * scale / m with
m = 2^(bits - 1), still in the rotated domain (the kernels rotate the query instead).

The encoder (`quant_rows`, the stand-in's quant_cache_paged) and the CUDA dequant (`dequant_rows_cuda`, the stand-in's
dequant_cache_paged / dequant_cache_paged_window) are written here from the arithmetic of the pinned wheel's
exllamav3_ext/cache/q_cache_kernels.cuh (quant_block_x4 / dequant_block_x4, compand_a 0), as the extension builds them
(--use_fast_math; the PTX was read for sm_90), operation for operation in fp32:
- the rotation is an unnormalized Hadamard butterfly over the group's 32 values in the kernels' stage order (index
  bits 0, 1 in registers, then 2, 3, 4 across lanes), each stage (lo, hi) -> (lo + hi, lo - hi) as fp32 adds, then a
  multiply by the fp32 constant 1/sqrt(32) (0x3E3504F3);
- the scale is s = fp32 group absmax + 1e-10f (fp32 add), stored as fp16 (round to nearest); the codes use the fp32
  s, not the stored fp16 one: q = floor(fma(v * (1 / s), m, m)) clamped to [0, 2m - 1] (v * (1 / s) an fp32 multiply,
  the fma exact here since m is a power of two);
- the dequant multiplies (q - (m - 1/2)) by (fp16 scale * 1/sqrt(32)) / m, undoes the rotation with the same
  butterfly and rounds to fp16.
One operation is not reproducible on a CPU: the extension's 1 / s is `rcp.approx.ftz.f32` (fast math: within 1 ulp
of the true reciprocal, hardware-defined), here the correctly rounded IEEE quotient. `rcp_sensitive` counts the values
whose code would change with either neighbouring fp32 reciprocal; where it is 0, the codes are the kernel's whatever
the hardware returned. Denormals do not arise (fp16 inputs), so flush-to-zero changes nothing.
`codec_check` verifies the encoder against upstream's decoder (every decoded value within half a grid step of the
rotated input) and the butterfly against upstream's `_get_h32` matrix (same signs, same magnitude).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import triton.language as tl

PAGE = 256


def _plain(*args: Any) -> list[Any]:
    """The arguments with any stand-in device subclass (_devsim.Dev) taken off: a reference's own work is host work,
    invisible to the probes' sync counting and to the census (one extension call is one launch)"""
    return [a.as_subclass(torch.Tensor) if isinstance(a, torch.Tensor) else a for a in args]


_KERNEL = None
R32 = torch.tensor(0.17677669529663688110, dtype=torch.float32)  # the kernels' fp32 1/sqrt(32)
EPS = torch.tensor(1e-10, dtype=torch.float32)  # added to the group absmax (fp32)


def enable() -> None:
    os.environ["TRITON_INTERPRET"] = "1"


def _h32() -> torch.Tensor:
    """Upstream's rotation matrix (fp16 entries, as its Triton kernels use it), in fp32: rotates decoded rows back"""
    from exllamav3.modules.attention_fn.triton_paged import _get_h32

    return _get_h32("cpu").float()


def butterfly(g: torch.Tensor) -> torch.Tensor:
    """(groups, 32) fp32 -> the unnormalized Hadamard transform of each group, stage by stage as the kernels add"""
    for b in range(5):
        h = 1 << b
        x = g.reshape(-1, 32 // (2 * h), 2, h)
        lo, hi = x[:, :, 0], x[:, :, 1]
        g = torch.stack((lo + hi, lo - hi), dim=2).reshape(-1, 32)
    return g


def _planes(bits: int) -> list[tuple[int, int]]:
    """(width, shift) of each bit plane, in the decoder's order (high bits first)"""
    widths = [w for w in (8, 4, 2, 1) if bits & w]
    out, shift = [], bits
    for w in widths:
        shift -= w
        out.append((w, shift))
    return out


def _rotated_scaled(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., dim) fp16 -> v (groups, 32) fp32 rotated and scaled by 1/sqrt(32), s (groups, 1) fp32 = absmax + 1e-10"""
    v = butterfly(x.reshape(-1, 32).float()) * R32
    return v, v.abs().amax(dim=-1, keepdim=True) + EPS


def _codes(v: torch.Tensor, inv_s: torch.Tensor, bits: int) -> torch.Tensor:
    m = float(1 << (bits - 1))
    return torch.floor((v * inv_s) * m + m).clamp(0, 2 * m - 1).to(torch.int64)


def quant_rows(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (..., dim) fp16, dim a multiple of 32 -> words (..., dim // 32 * bits) int32, scales (..., dim // 32) fp16"""
    lead, dim = x.shape[:-1], x.shape[-1]
    v, s = _rotated_scaled(x)
    q = _codes(v, torch.ones_like(s) / s, bits)  # (groups, 32)
    words = []
    for w, shift in _planes(bits):
        vpw = 32 // w
        vals = ((q >> shift) & ((1 << w) - 1)).view(-1, w, vpw)  # value d = j * vpw + k -> word j, lane k
        word = (vals << (torch.arange(vpw, dtype=torch.int64) * w)).sum(-1)  # (groups, w)
        words.append(word)
    packed = torch.cat(words, dim=-1)  # (groups, bits)
    packed = torch.where(packed >= (1 << 31), packed - (1 << 32), packed).to(torch.int32)
    return packed.reshape(*lead, dim // 32 * bits), s.half().reshape(*lead, dim // 32)


def rcp_sensitive(x: torch.Tensor, bits: int) -> int:
    """How many values of x would get another code if 1 / s were either neighbouring fp32 value (the range the
    extension's approximate reciprocal can return)"""
    v, s = _rotated_scaled(x)
    inv = torch.ones_like(s) / s
    q = _codes(v, inv, bits)
    changed = torch.zeros_like(q, dtype=torch.bool)
    for towards in (torch.zeros_like(inv), torch.full_like(inv, float("inf"))):
        changed |= _codes(v, torch.nextafter(inv, towards), bits) != q
    return int(changed.sum())


def _unpack(words: torch.Tensor, bits: int) -> torch.Tensor:
    """words (groups, bits) int32 -> codes (groups, 32) int64"""
    w64 = words.to(torch.int64) & 0xFFFFFFFF
    q = torch.zeros(words.shape[0], 32, dtype=torch.int64)
    base = 0
    for w, shift in _planes(bits):
        vpw = 32 // w
        lanes = torch.arange(vpw, dtype=torch.int64) * w
        vals = (w64[:, base : base + w, None] >> lanes) & ((1 << w) - 1)  # (groups, w, vpw)
        q |= vals.reshape(-1, 32) << shift
        base += w
    return q


def dequant_rows_cuda(words: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """The extension's dequant (dequant_block_x4): words (..., dim // 32 * bits), scales (..., dim // 32) -> (..., dim)
    fp16, original domain"""
    lead, groups = words.shape[:-1], scale.shape[-1]
    q = _unpack(words.reshape(-1, bits), bits)
    s = scale.reshape(-1, 1).float() * R32
    m = 1 << (bits - 1)
    v = (q.float() - (m - 0.5)) * (s * (1.0 / m))
    return butterfly(v).half().reshape(*lead, groups * 32)


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
    half a grid step (scale / 2m); <= 1 (plus fp16 rounding) when the encoder writes the format the decoder reads.
    Also: the butterfly is upstream's H32 (signs and magnitude), and the CUDA dequant agrees with upstream's decoder
    rotated back (max abs difference: both round to fp16, in different orders)"""
    x = torch.randn(rows, n_kv_heads * head_dim, generator=gen).half()
    x[:, 3] *= 8  # an outlier channel
    words, scale = quant_rows(x, bits)
    got = dequant_rotated(words, scale, bits, n_kv_heads).float().view(-1, 32)
    want = butterfly(x.float().view(-1, 32)) * R32
    step = scale.float().view(-1, 1) / (1 << (bits - 1)) / 2
    err = (got - want).abs() / step
    back = dequant_rows(words, scale, bits, n_kv_heads).float()
    rel = float((back - x.float()).norm() / x.float().norm())
    h = butterfly(torch.eye(32)) * R32
    upstream = _h32()
    return {
        "max_half_steps": float(err.max()),
        "rel_l2": rel,
        "h32_signs_equal": bool(torch.equal(h.sign(), upstream.sign())),
        "h32_max_abs": float((h - upstream).abs().max()),
        "cuda_vs_triton_max_abs": float((dequant_rows_cuda(words, scale, bits).float() - back).abs().max()),
        "rcp_sensitive": rcp_sensitive(x, bits),
    }


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
    k_in, k_out, k_sc, v_in, v_out, v_sc, cache_seqlens, block_table = _plain(
        k_in, k_out, k_sc, v_in, v_out, v_sc, cache_seqlens, block_table
    )
    kb = k_out.shape[-1] // k_sc.shape[-1]
    vb = v_out.shape[-1] // v_sc.shape[-1]
    for b in range(block_table.shape[0]):
        base = int(cache_seqlens[b])
        for r in range(seq_len):
            page, row = int(block_table[b, (base + r) // PAGE]), (base + r) % PAGE
            kw, ks = quant_rows(k_in[b, r].reshape(-1), kb)
            vw, vs = quant_rows(v_in[b, r].reshape(-1), vb)
            k_out[page, row], k_sc[page, row], v_out[page, row], v_sc[page, row] = kw, ks, vw, vs


def dequant_paged(compact: bool) -> Any:
    """The paged / window dequant references of _qcache_ref, rows decoded with the CUDA arithmetic"""
    import _qcache_ref

    return _qcache_ref.dequant_paged(compact, dequant_rows_cuda)


def install(standin_module: Any) -> None:
    standin_module.REFERENCES["quant_cache_paged"] = quant_cache_paged
    standin_module.REFERENCES["dequant_cache_paged"] = dequant_paged(compact=False)
    standin_module.REFERENCES["dequant_cache_paged_window"] = dequant_paged(compact=True)
