"""Probe: drive the real SlidingAttention window-state code through a random schedule and record every output.

The window ring methods (SlidingAttention.decode_flash_attn decode and prefill branches, plan_state_rows /
write_state_rows / commit_state_rows, SWAState.rewind / stash / unstash, advance_recurrent_states) run
unmodified. Only what cannot run on CPU is replaced: the Q/K/V projections (random rows from the payload
seed instead) and the two Triton paged-attention kernels (a torch reference below, test infrastructure, that
reads and writes the pages exactly through the block table and sequence lengths it is given).

An unbounded oracle keeps the K/V of every absolute position. Each step's output is compared bit for bit with
attention over the oracle's rows, and its sha256 is reported so stock and patched arms can be compared.

payload: {"seed": int, "window": int, "steps": int, "bsz": int, "ring": bool, "static": bool, "causal": bool,
          "device": "cpu"|"cuda", "kernels": "reference"|"real"|"interpret", "quant": [k_bits, v_bits] | null,
          "grid": bool, "head_dim": int (16), "codec": "reference"|"real"}
"kernels": "interpret" runs upstream's two Triton paged-attention kernels on CPU in Triton's interpreter
(_triton_cpu.py) instead of the torch references below; outputs are then compared with the unbounded history within
a tolerance (max_abs_vs_oracle) and bit for bit across arms, as on a GPU.
"codec": "real" (head_dim a multiple of 32) uses the extension's format instead: upstream's Triton decoder
(_qc_load_v, run by Triton's CPU interpreter) and an encoder checked against it (_qcache_real.py).
Per DFlash write-back (plan/write/commit): "ring_digests", the sha256 of the fp16 ring states (every slot's rows,
k and v) after the write, and "write_ops", the aten ops write_state_rows dispatched (views left out), by name.
"quant" builds the cache with swa_ring_bits (the patched quantized ring); on CPU the quantized-cache kernels are
the references in _qcache_ref.py, and "grid" draws K/V on that codec's grid so the round trip is exact.
On a GPU (scripts/device/exllamav3_check.py) "kernels": "real" keeps the Triton kernels; outputs are then
compared with the unbounded history within a tolerance (max_abs_vs_oracle), and bit for bit across arms.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from typing import Any

from _common import emit, read_payload

PAYLOAD = read_payload()
if PAYLOAD.get("ring"):
    os.environ["EXL3_OVL_SWA_RING"] = "1"
if PAYLOAD.get("static"):
    os.environ["EXL3_OVL_SWA_RING_STATIC"] = "1"  # persistent ring step tables (patched)
REAL_CODEC = PAYLOAD.get("codec") == "real"
KERNELS = PAYLOAD.get("kernels", "reference")
if REAL_CODEC or KERNELS == "interpret":
    import _qcache_real

    _qcache_real.enable()  # upstream's Triton code runs in Triton's CPU interpreter

import torch
from _ring_ref import HKV, HQ, PAGE, attend, attention_kernels, decode_reference, visible

D = int(PAYLOAD.get("head_dim", 16))


def page_row(k_pages: torch.Tensor, bt_row: torch.Tensor, logical: int) -> tuple[int, int]:
    return int(bt_row[logical // PAGE]), logical % PAGE


def _dequant(words: torch.Tensor, scales: torch.Tensor, bits: int) -> torch.Tensor:
    if REAL_CODEC:
        return _qcache_real.dequant_rows(words, scales, bits, HKV)
    from _qcache_ref import dequant_rows

    return dequant_rows(words, scales, bits)


ref_decode = decode_reference(_dequant, head_dim=D)


def ref_prefill(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    k_pages: Any,
    v_pages: Any,
    bt: Any,
    cache_seqlens: Any,
    causal: Any = True,
    softmax_scale: Any = None,
    window_size: Any = (-1, -1),
    softcap: Any = 0.0,
    sinks: Any = None,
    k_new: Any = None,
    v_new: Any = None,
) -> Any:
    """Reference for paged_attn_triton_prefill: keys = cache rows [0, seqlen) through bt, then k_new."""
    bsz, qlen = q.shape[:2]
    out = torch.empty_like(q)
    left, right = window_size
    right = 0 if causal else right
    for b in range(bsz):
        hot = int(cache_seqlens[b]) if cache_seqlens is not None else 0
        rows_k = [k_pages[page_row(k_pages, bt[b], j)] for j in range(hot)] if hot else []
        rows_v = [v_pages[page_row(v_pages, bt[b], j)] for j in range(hot)] if hot else []
        rows_k += list(k_new[b])
        rows_v += list(v_new[b])
        for r in range(qlen):
            span = visible(hot + r, hot + k_new.shape[1], left, right)
            out[b, r] = attend(q[b, r], [rows_k[j] for j in span], [rows_v[j] for j in span], softmax_scale)
    return out


def _count_quant_writes(sliding_attn: Any) -> dict[str, int]:
    """What the quantized ring's row writes (SWALayerState_quant.write_rows: DFlash write-back and a prefill's
    surviving rows) ask of the device, counted as they run: the schedule's steps that write rows (filled in by the
    schedule), calls, rows, host-to-device uploads
    (sliding_attn.host_to_device) and quant_cache_paged launches inside them; and the prefill's fp16 scratch (the
    dequant kernels' output pages, largest seen) next to the ring pool's pages."""
    standin = sys.modules["exllamav3_ext"]
    counts = {
        "steps": 0,
        "calls": 0,
        "rows": 0,
        "uploads": 0,
        "launches": 0,
        "scratch_pages": 0,
        "pool_pages": 0,
    }
    inside = [False]
    upload = sliding_attn.host_to_device

    def counted_upload(*args: Any, **kwargs: Any) -> Any:
        counts["uploads"] += inside[0]
        return upload(*args, **kwargs)

    sliding_attn.host_to_device = counted_upload
    cls = sliding_attn.SWALayerState_quant
    write_rows = cls.write_rows

    def counted_write(self: Any, *args: Any) -> Any:
        # the old signature (slot, t0, k, v) wrote one row per call; the batched one takes [(slot, t0, k, v)]
        rows = args[0] if len(args) == 1 else [args]
        counts["calls"] += 1
        counts["rows"] += sum(int(r[2].shape[0]) for r in rows)
        before = standin.calls["quant_cache_paged"]
        inside[0] = True
        try:
            return write_rows(self, *args)
        finally:
            inside[0] = False
            counts["launches"] += standin.calls["quant_cache_paged"] - before

    cls.write_rows = counted_write
    for name in ("dequant_cache_paged", "dequant_cache_paged_window"):
        ref = standin.REFERENCES.get(name)
        if ref is None:
            continue

        def scratch(*args: Any, _ref: Any = ref) -> Any:
            counts["scratch_pages"] = max(counts["scratch_pages"], int(args[2].shape[0]))
            counts["pool_pages"] = int(args[0].shape[0])
            return _ref(*args)

        standin.REFERENCES[name] = scratch
    return counts


def _ring_rows_check(
    states: list[Any], rsl: Any, S: int, window: int, oracle_k: list[Any], oracle_v: list[Any]
) -> dict[str, Any]:
    """Every row each state's window holds, as the quantized ring stores it, against the reference encoder (the CUDA
    kernel's arithmetic, _qcache_real.quant_rows) applied to that position's fp16 K/V: packed words and fp16 scales
    equal, and the rows upstream's Triton decoder (_qc_load_v) reads back from the ring equal, bit for bit, what it
    reads from the encoder's. `rcp_sensitive`: values whose code depends on the extension's approximate reciprocal."""
    checked = mismatched = sensitive = 0
    for b, rs in enumerate(states):
        positions = list(range(max(0, rs.position - window), rs.position))
        if not positions:
            continue
        at = torch.tensor([t % S for t in positions])
        for words, scales, bits, oracle in (
            (rsl.qk, rsl.sk, rsl.k_bits, oracle_k),
            (rsl.qv, rsl.sv, rsl.v_bits, oracle_v),
        ):
            rows = torch.stack([oracle[b][t] for t in positions]).reshape(len(positions), -1)
            want_w, want_s = _qcache_real.quant_rows(rows, bits)
            got_w, got_s = words[rs.slot, at].cpu(), scales[rs.slot, at].cpu()
            same = (got_w == want_w).all(-1) & (got_s.view(torch.int16) == want_s.view(torch.int16)).all(-1)
            got = _qcache_real.dequant_rotated(got_w, got_s, bits, HKV)
            want = _qcache_real.dequant_rotated(want_w, want_s, bits, HKV)
            same &= (got.view(torch.int16) == want.view(torch.int16)).all(-1)
            checked += len(positions)
            mismatched += int((~same).sum())
            sensitive += _qcache_real.rcp_sensitive(rows, bits)
    return {"rows": checked, "mismatches": mismatched, "rcp_sensitive": sensitive}


class _OpCounter:
    """The aten ops dispatched inside a `with` block, views left out (a TorchDispatchMode), by op name"""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):  # type: ignore[misc]  # torch's mode base is untyped here
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if not func.is_view:
                    name = func.overloadpacket.__name__
                    counter.ops[name] = counter.ops.get(name, 0) + 1
                return func(*args, **(kwargs or {}))

        self.ops: dict[str, int] = {}
        self.mode = Mode()

    def __enter__(self) -> _OpCounter:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


def main() -> None:
    import tempfile
    from pathlib import Path

    from _common import tiny_dflash2
    from exllamav3 import Cache, Config, Model
    from exllamav3.cache.recurrent_util import advance_recurrent_states
    from exllamav3.modules import sliding_attn

    device = torch.device(PAYLOAD.get("device", "cpu"))
    graphed_served = attention_kernels(PAYLOAD, ref_decode, sliding_attn)
    if KERNELS == "reference":
        sliding_attn.paged_attn_triton_prefill = ref_prefill
    if KERNELS != "real":  # no extension: the quantized-cache kernels are CPU references
        if PAYLOAD.get("quant") and REAL_CODEC:
            _qcache_real.install(sys.modules["exllamav3_ext"])
        elif PAYLOAD.get("quant"):
            import _qcache_ref

            _qcache_ref.install(sys.modules["exllamav3_ext"])
    writes = _count_quant_writes(sliding_attn) if PAYLOAD.get("quant") and KERNELS != "real" else None

    rnd = random.Random(PAYLOAD["seed"])
    gen = torch.Generator().manual_seed(PAYLOAD["seed"])
    window = PAYLOAD.get("window", 256)
    bsz = PAYLOAD.get("bsz", 1)
    causal = PAYLOAD.get("causal", True)

    with tempfile.TemporaryDirectory() as tmp:
        types = ["sliding_attention"]
        directory = tiny_dflash2(
            Path(tmp) / "d",
            layers=1,
            layer_types=types,
            window=window + 1,
            hidden=4 * D,
            kv_heads=HKV,
            head_dim=D,
        )
        config = Config.from_directory(str(directory))
        config.is_causal = causal
        model = Model.from_config(config)
        cache_kwargs = {"swa_ring_bits": tuple(PAYLOAD["quant"])} if PAYLOAD.get("quant") else {}
        cache = Cache(model, max_num_tokens=PAGE, max_batch_size=bsz + 1, **cache_kwargs)
        layer = model.attn_modules[0]
        assert isinstance(layer, sliding_attn.SlidingAttention)
        layer.device = device
        layer.q_norm = layer.k_norm = layer.v_norm = None
        layer.rope = None
        layer.project_o = lambda o, bsz_, seqlen_, params_: o
        for state_layer in cache.recurrent_layers.values():
            state_layer.alloc(device)
        rsl = cache.get_recurrent_layer((0, 0))
        S = layer.kv_state_size
        win = (layer.sliding_window, layer.window_right)

        states = [cache.get_new_state() for _ in range(bsz)]
        floors = [0] * bsz
        oracle_k: list[list[torch.Tensor]] = [[] for _ in range(bsz)]
        oracle_v: list[list[torch.Tensor]] = [[] for _ in range(bsz)]
        # with the real codec: the same history as the cache stores it (each row quantized by the CUDA kernel's
        # arithmetic), decoded as each path reads it: by upstream's Triton decoder at decode (the kernel's online
        # dequant), by the CUDA dequant for a prefill (the extension's dequant_cache_paged_window into fp16
        # scratch), so a ring that reads the right rows matches it bit for bit
        quant_oracle = REAL_CODEC and bool(PAYLOAD.get("quant"))
        oracle_kq: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(bsz)]
        oracle_vq: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(bsz)]
        quant_mismatches = 0

        def stored(rows: torch.Tensor, bits: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            """per row: (as the decode kernel reads it, as the prefill's CUDA dequant reads it)"""
            words, scales = _qcache_real.quant_rows(rows.reshape(rows.shape[0], -1), bits)
            triton = _qcache_real.dequant_rows(words, scales, bits, HKV).view(rows.shape)
            cuda = _qcache_real.dequant_rows_cuda(words, scales, bits).view(rows.shape)
            return list(zip(triton, cuda))

        def record(b: int, p0: int, k_rows: torch.Tensor, v_rows: torch.Tensor) -> None:
            del oracle_k[b][p0:], oracle_v[b][p0:]
            oracle_k[b] += list(k_rows)
            oracle_v[b] += list(v_rows)
            if quant_oracle:
                del oracle_kq[b][p0:], oracle_vq[b][p0:]
                oracle_kq[b] += stored(k_rows, PAYLOAD["quant"][0])
                oracle_vq[b] += stored(v_rows, PAYLOAD["quant"][1])

        pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]] = []
        layer.project_qkv = lambda x, params: pending.pop()
        digests, mismatches, counts = (
            [],
            0,
            {"prefill": 0, "decode": 0, "write_back": 0, "rewind": 0, "stash": 0},
        )
        clones = 0
        ring_digests: list[str] = []
        write_ops: list[dict[str, int]] = []
        max_abs = max_abs_q = 0.0
        real_clone = torch.Tensor.clone

        def counting_clone(self: Any, *a: Any, **kw: Any) -> Any:
            nonlocal clones
            clones += 1
            return real_clone(self, *a, **kw)

        torch.Tensor.clone = counting_clone

        def kv_rows(*shape: Any) -> Any:
            if PAYLOAD.get("grid"):
                from _qcache_ref import grid_values

                return grid_values(shape, 8, gen)
            return torch.randn(*shape, generator=gen).half()

        def forward(n: int) -> None:
            nonlocal mismatches, max_abs, quant_mismatches, max_abs_q
            if writes is not None and n > 16:
                writes["steps"] += 1  # a prefill writes its surviving rows into the ring
            q = torch.randn(bsz, n, HQ, D, generator=gen).half()
            k = kv_rows(bsz, n, HKV, D)
            v = kv_rows(bsz, n, HKV, D)
            pending.append((q.to(device), k.to(device), v.to(device), None))
            params = {"recurrent_states": states, "causal": causal}
            o = layer.decode_flash_attn(torch.zeros(bsz, n, 4 * D, device=device), bsz, n, params)
            o = o.view(bsz, n, HQ, D).cpu()
            if graphed_served():  # the layer's own projections ran (this or an earlier step): digests only
                pending.clear()
                digests.append(hashlib.sha256(o.contiguous().numpy().tobytes()).hexdigest()[:16])
                advance_recurrent_states(torch.zeros(bsz, n), {"recurrent_states": states}, model)
                return
            for b, rs in enumerate(states):
                p0 = rs.position
                record(b, p0, k[b], v[b])
                for r in range(n):
                    span = visible(p0 + r, p0 + n, win[0], 0 if causal else win[1])
                    if quant_oracle:
                        # decode: the step's rows are quantized into the ring before attention; prefill: the
                        # chunk's own rows are read from the projection (fp16), the earlier ones from the ring
                        raw = n > 16
                        kq = [oracle_k[b][j] if raw and j >= p0 else oracle_kq[b][j][raw] for j in span]
                        vq = [oracle_v[b][j] if raw and j >= p0 else oracle_vq[b][j][raw] for j in span]
                        want_q = attend(q[b, r], kq, vq, layer.sm_scale)
                        quant_mismatches += int(not torch.equal(want_q, o[b, r]))
                        max_abs_q = max(max_abs_q, float((want_q.float() - o[b, r].float()).abs().max()))
                    want = attend(
                        q[b, r],
                        [oracle_k[b][j] for j in span],
                        [oracle_v[b][j] for j in span],
                        layer.sm_scale,
                    )
                    mismatches += int(not torch.equal(want, o[b, r]))
                    max_abs = max(max_abs, float((want.float() - o[b, r].float()).abs().max()))
            digests.append(hashlib.sha256(o.contiguous().numpy().tobytes()).hexdigest()[:16])
            advance_recurrent_states(torch.zeros(bsz, n), {"recurrent_states": states}, model)

        for _ in range(PAYLOAD.get("steps", 200)):
            op = rnd.choices(["prefill", "decode", "write_back", "rewind", "stash"], [1, 10, 6, 2, 1])[0]
            if op == "prefill":
                forward(rnd.randint(17, min(S, 300)))
            elif op == "decode":
                forward(rnd.randint(1, 8))
            elif op == "write_back":
                # DFlash round: the drafter appends its block, then the verified rows overwrite it from the
                # pre-block position (plan/write/commit, as dflash_update_kv_from_target does)
                before = [rs.position for rs in states]
                forward(8)
                lengths = [rnd.randint(1, 8) for _ in states]
                k = kv_rows(bsz, 8, HKV, D)
                v = kv_rows(bsz, 8, HKV, D)
                plan = layer.plan_state_rows(states, before, lengths, 8)
                if writes is not None:
                    writes["steps"] += 1
                k_dev, v_dev = k.to(device), v.to(device)
                with _OpCounter() as ops:
                    layer.write_state_rows(states, plan, k_dev, v_dev)
                write_ops.append(ops.ops)
                sliding_attn.SlidingAttention.commit_state_rows(states, plan)
                if not PAYLOAD.get("quant"):
                    h = hashlib.sha256()
                    for t in rsl.get_state_tensors():
                        h.update(t.contiguous().cpu().numpy().tobytes())
                    ring_digests.append(h.hexdigest()[:16])
                for b in range(bsz):
                    record(b, before[b], k[b, : lengths[b]], v[b, : lengths[b]])
            elif op == "rewind":
                # Speculative rejection: at most a draft's worth, never below a restored checkpoint (a
                # checkpoint holds the last window only; the generator resumes forward from it)
                for b, rs in enumerate(states):
                    rs.rewind(rnd.randint(0, min(8, rs.rollback_capacity(), rs.position - floors[b])))
            elif op == "stash":
                # Checkpoint round trip at a page boundary: stash, free, restore into a fresh slot
                gap = -states[0].position % PAGE
                if gap:
                    forward(gap if gap <= 16 else max(gap, 17))
                b = rnd.randrange(bsz)
                rs = states[b]
                if rs.position % PAGE or rs.position == 0:
                    continue
                stashed = rs.stash()
                rs.free()
                states[b] = cache.new_from_stashed(stashed, rs.position)
                floors[b] = rs.position
            counts[op] += 1

        torch.Tensor.clone = real_clone
        ring_rows = (
            _ring_rows_check(states, rsl, S, layer.sliding_window, oracle_k, oracle_v)
            if quant_oracle
            else None
        )
        codec_check = None
        if REAL_CODEC and PAYLOAD.get("quant"):
            # the encoder against upstream's decoder, and the authors' reference codec read by upstream's decoder
            import _qcache_ref

            bits = PAYLOAD["quant"][0]
            codec_check = _qcache_real.codec_check(torch.Generator().manual_seed(9), bits, HKV, D)
            x = torch.randn(64, HKV * D, generator=torch.Generator().manual_seed(9)).half()
            words, scales = _qcache_ref.quant_rows(x, bits)
            back = _qcache_real.dequant_rows(words, scales, bits, HKV).float()
            codec_check["authors_codec_rel_l2"] = float((back - x.float()).norm() / x.float().norm())
        emit(
            {
                "digests": digests,
                "oracle_mismatches": mismatches,
                "max_abs_vs_oracle": max_abs,
                "counts": counts,
                "clones": clones,
                "final_positions": [rs.position for rs in states],
                "kv_state_size": S,
                "ring": bool(getattr(layer, "ring", False)),
                "state": type(rsl).__name__,
                "state_bytes": int(rsl.storage_size()),
                "codec_check": codec_check,
                "quant_oracle_mismatches": quant_mismatches if quant_oracle else None,
                "max_abs_vs_quant_oracle": max_abs_q if quant_oracle else None,
                "graphed_steps": graphed_served(),
                "quant_writes": writes,
                "ring_rows": ring_rows,
                "ring_digests": ring_digests,
                "write_ops": write_ops,
            }
        )


if __name__ == "__main__":
    main()
