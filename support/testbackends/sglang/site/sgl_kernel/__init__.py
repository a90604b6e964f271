"""TEST INFRASTRUCTURE (overlay SGLang CPU harness): a pure-torch stand-in for the CPU build of ``sgl_kernel``.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports a CPU build of ``sgl_kernel`` for cache-location
bookkeeping, speculative tree verification and the ``intel_amx`` attention backend. No such build is on the package
index, and the real one needs AVX-512/AMX. This stand-in implements the few ops the SGLang 0.5.23 text + STANDALONE
speculative path calls, written from their documented semantics in plain torch (reference speed, reference
numerics). Limits: attention is causal (or full) only: no tree mask, sinks or sliding window; ``topk > 1`` draft
trees are not supported by the attention. Any other attribute resolves to a function that raises with the op name,
so a path this stand-in does not cover fails loudly.

Never shipped inside a patched wheel; put on ``PYTHONPATH`` of test arms only.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

import torch

__version__ = "0.0.0+overlay.cpu.standin"
OVERLAY_TEST_BACKEND = True


def _rows(req_pool_indices: torch.Tensor) -> list[int]:
    return [int(i) for i in req_pool_indices.tolist()]


def _packed_spans(
    req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor
) -> list[tuple[int, slice, slice]]:
    """Per request: its ``req_to_token`` row, the span ``[s, e)`` in that row, and where it sits in a buffer that packs
    every request's span in batch order."""
    spans, cursor = [], 0
    for row, s, e in zip(_rows(req_pool_indices), start_offset.tolist(), end_offset.tolist()):
        n = int(e) - int(s)
        spans.append((row, slice(int(s), int(e)), slice(cursor, cursor + n)))
        cursor += n
    return spans


# --- cache-location bookkeeping -------------------------------------------------------------------------------


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write request i's new slots ``out_cache_loc`` (packed, in batch order) into ``req_to_token[row_i, s:e]``."""
    for row, span, packed in _packed_spans(req_pool_indices, start_offset, end_offset):
        req_to_token[row, span] = out_cache_loc[packed].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather ``req_to_token[row_i, s:e]`` of every request into ``out_cache_loc``, packed in batch order."""
    for row, span, packed in _packed_spans(req_pool_indices, start_offset, end_offset):
        out_cache_loc[packed] = req_to_token[row, span].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Request i's draft slots are ``topk * num_steps`` consecutive entries of its row from ``seq_lens[i]`` on."""
    width = int(topk) * int(num_steps)
    for i, (row, start) in enumerate(zip(_rows(req_pool_indices), seq_lens.tolist())):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[row, int(start) : int(start) + width].to(
            out_cache_loc.dtype
        )


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """One ``req_to_token`` row per draft candidate: the committed prefix, then the candidate's own draft slots."""
    rows = _rows(req_pool_indices)
    out = torch.zeros((len(rows) * int(topk), int(pool_len)), dtype=req_to_token.dtype)
    for i, (row, length) in enumerate(zip(rows, seq_lens.tolist())):
        length = int(length)
        for k in range(int(topk)):
            dst = out[i * int(topk) + k]
            dst[:length] = req_to_token[row, :length]
            src = length + k * int(num_steps)
            dst[length : length + int(num_steps)] = req_to_token[row, src : src + int(num_steps)]
    return out


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``bonus[i]`` = the last accepted token of request i (row stride ``accept_stride``)."""
    flat = accept_tokens.reshape(-1)
    for i, n in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[int(accept_stride) * i + int(n) - 1]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """Pack ``out_cache_loc[j]`` for every accepted index ``j != -1`` (in order) into ``accept_out_cache_loc``."""
    flat = accept_index.reshape(-1)
    picked = flat[flat != -1].to(torch.long)
    accept_out_cache_loc[: picked.numel()] = out_cache_loc[picked].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer (raw base pointer, row bytes): copy row ``src_loc[j]`` onto row ``tgt_loc[j]``."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        base = int(base) & ((1 << 64) - 1)
        stride = int(stride)
        for tgt, src in pairs:
            if tgt != src:
                ctypes.memmove(base + int(tgt) * stride, base + int(src) * stride, stride)


# --- speculative tree ops ---------------------------------------------------------------------------------------


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the EAGLE draft tree of every request.

    Node 0 is the verified last token; node ``j >= 1`` is draft candidate ``selected_index[b, j-1]`` (an index into
    the flattened per-step top-k scores). Its parent is node 0 when ``selected_index // topk == 0``, else the node
    whose selected index equals ``parent_list[b, selected_index // topk]``. Outputs: ``positions`` (seq_len + depth
    of the node), the retrieve arrays (first child / next sibling linked lists, children newest first) and the
    boolean ``tree_mask`` (each node sees itself and its ancestors; FULL_MASK also lays out the committed prefix).
    """
    n = int(draft_token_num)
    topk = int(topk)
    bs = verified_seq_len.shape[0]
    seq_lens = [int(x) for x in verified_seq_len.tolist()]
    prefix_sum = 0
    for b in range(bs):
        sel = [int(x) for x in selected_index[b].tolist()][: n - 1]
        plist = [int(x) for x in parent_list[b].reshape(-1).tolist()] if parent_list.numel() else []
        parent = [-1] * n
        for j in range(1, n):
            group = sel[j - 1] // topk
            if group == 0:
                parent[j] = 0
            else:
                want = plist[group]
                found = [p for p in range(n - 1) if sel[p] == want]
                parent[j] = found[0] + 1 if found else -1
        node_depth = [0] * n
        for j in range(1, n):
            d, p = 0, j
            while p > 0 and d <= int(depth):
                d += 1
                p = parent[p]
            node_depth[j] = d
        base = b * n
        retrieve_next_token[b].fill_(-1)
        retrieve_next_sibling[b].fill_(-1)
        for j in range(n):
            retrieve_index[b, j] = base + j
            positions[base + j] = seq_lens[b] + node_depth[j]
        for j in range(n - 1, 0, -1):
            p = parent[j]
            if p < 0:
                continue
            previous_first = int(retrieve_next_token[b, p])
            retrieve_next_token[b, p] = j
            if previous_first != -1:
                retrieve_next_sibling[b, j] = previous_first
        visible = torch.zeros((n, n), dtype=torch.bool)
        for j in range(n):
            p = j
            while p >= 0:
                visible[j, p] = True
                p = parent[p] if p > 0 else -1
        if int(tree_mask_mode) == 0:  # FULL_MASK: rows of (seq_len + n) entries, prefix visible
            width = seq_lens[b] + n
            offset = prefix_sum * n + b * n * n
            block = torch.ones((n, width), dtype=torch.bool)
            block[:, seq_lens[b] :] = visible
            tree_mask[offset : offset + n * width] = block.reshape(-1).to(tree_mask.dtype)
        elif int(tree_mask_mode) == 1:  # QLEN_ONLY: n x n per request
            offset = b * n * n
            tree_mask[offset : offset + n * n] = visible.reshape(-1).to(tree_mask.dtype)
        else:
            raise NotImplementedError(
                f"build_tree_kernel_efficient_cpu: tree_mask_mode={tree_mask_mode} (bit-packed) is not covered by "
                "the overlay CPU stand-in"
            )
        prefix_sum += seq_lens[b]


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree walk: from the root, follow the child whose draft token equals the target's argmax.

    ``accept_index[b, 0]`` is the root, then the retrieve index of every accepted node; ``accept_token_num[b]``
    counts accepted drafts; ``predicts[node]`` is the target token at every accepted node (the last one is the
    bonus token).
    """
    bs = candidates.shape[0]
    max_accept = accept_index.shape[1]
    target_flat = target_predict.reshape(-1)
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted = 0
        node = 0
        for _ in range(1, max_accept):
            child = int(retrive_next_token[b, node])
            want = int(target_flat[last])
            matched = -1
            while child != -1:
                if int(candidates[b, child]) == want:
                    matched = child
                    break
                child = int(retrive_next_sibling[b, child])
            if matched == -1:
                break
            predicts[last] = want
            accepted += 1
            last = int(retrive_index[b, matched])
            accept_index[b, accepted] = last
            node = matched
        accept_token_num[b] = accepted
        predicts[last] = target_flat[last]


# --- reference attention (registered under torch.ops.sgl_kernel) ----------------------------------------------


def _attend(
    q: torch.Tensor,  # [Lq, H, D]
    keys: torch.Tensor,  # [Lk, Hkv, D]
    values: torch.Tensor,  # [Lk, Hkv, Dv]
    scaling: float,
    logit_cap: float,
    causal_offset: int | None,
) -> torch.Tensor:
    heads, kv_heads = q.shape[1], keys.shape[1]
    if heads != kv_heads:
        keys = keys.repeat_interleave(heads // kv_heads, dim=1)
        values = values.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys.float()) * float(scaling)
    if logit_cap and logit_cap > 0:
        scores = float(logit_cap) * torch.tanh(scores / float(logit_cap))
    if causal_offset is not None:
        lq, lk = q.shape[0], keys.shape[0]
        allowed = torch.arange(lk)[None, :] <= (torch.arange(lq)[:, None] + causal_offset)
        scores = scores.masked_fill(~allowed[None], -math.inf)
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values.float())


def _unsupported(name: str, **features: Any) -> None:
    used = [k for k, v in features.items() if v]
    if used:
        raise NotImplementedError(
            f"{name}: {', '.join(used)} not covered by the overlay CPU stand-in sgl_kernel"
        )


def decode_attention_cpu(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    o: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    cache_loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scaling: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One query token per row; writes the new K/V at ``cache_loc`` first when given, then attends over the row."""
    _unsupported(
        "decode_attention_cpu",
        cross_attention=is_cross_attention,
        sliding_window=sliding_window_size > 0,
        sinks=sinks is not None,
        kv_scales=(key_scale or 1.0) != 1.0 or (value_scale or 1.0) != 1.0,
    )
    if k is not None and v is not None:
        loc = cache_loc.to(torch.long)
        k_buffer[loc] = k.reshape(loc.shape[0], *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[loc] = v.reshape(loc.shape[0], *v_buffer.shape[1:]).to(v_buffer.dtype)
    for i, (row, length) in enumerate(zip(_rows(req_pool_indices), seq_lens.tolist())):
        idx = req_to_token[row, : int(length)].to(torch.long)
        out = _attend(q[i : i + 1], k_buffer[idx], v_buffer[idx], scaling, logit_cap, None)
        o[i] = out[0].to(o.dtype)


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int | None,
    scaling: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Extend queries (the last ``extend_seq_lens[i]`` tokens of each row) attend to the whole row, causally when
    ``is_causal``. As in the real kernel, the prefix (the first ``seq_lens[i] - extend_seq_lens[i]`` tokens) is read
    from the cache and the extend part from ``k_extend``/``v_extend`` when they are given (from the cache when they
    are ``None``), so the two may differ in layout: DeepSeek's MHA prefill over an MLA latent cache passes
    per-head K/V here while the cache holds the latent rows."""
    _unsupported(
        "extend_attention_cpu",
        cross_attention=is_cross_attention,
        sliding_window=sliding_window_size > 0,
        sinks=sinks is not None,
        tree_mask=tree_mask is not None,
        kv_scales=(key_scale or 1.0) != 1.0 or (value_scale or 1.0) != 1.0,
    )
    rows = _rows(req_pool_indices)
    for row, length, ext, start in zip(
        rows, seq_lens.tolist(), extend_seq_lens.tolist(), extend_start_loc.tolist()
    ):
        length, ext, start = int(length), int(ext), int(start)
        if k_extend is not None and v_extend is not None:
            keys, values = k_extend[start : start + ext], v_extend[start : start + ext]
            if length > ext:
                idx = req_to_token[row, : length - ext].to(torch.long)
                keys = torch.cat([k_buffer[idx].to(keys.dtype), keys])
                values = torch.cat([v_buffer[idx].to(values.dtype), values])
        else:
            idx = req_to_token[row, :length].to(torch.long)
            keys, values = k_buffer[idx], v_buffer[idx]
        out = _attend(
            q_extend[start : start + ext],
            keys,
            values,
            scaling,
            logit_cap,
            (length - ext) if is_causal else None,
        )
        o_extend[start : start + ext] = out.to(o_extend.dtype)


# --- registration -------------------------------------------------------------------------------------------


class _OpWithOverloads:
    """Mimics an OpOverloadPacket just enough: callable, with ``.default``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self.default = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)


def _register_torch_ops() -> None:
    namespace = torch.ops.sgl_kernel
    for fn in (decode_attention_cpu, extend_attention_cpu):
        setattr(namespace, fn.__name__, _OpWithOverloads(fn))


_register_torch_ops()


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by the overlay CPU stand-in (test infrastructure, "
            "support/testbackends/sglang/site/sgl_kernel); this path needs a real sgl_kernel build"
        )

    _missing.__name__ = name
    return _missing
