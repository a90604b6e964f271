"""Probe: a DFlash2 drafter whose window rings may differ per layer (checkpoint sliding layers next to layers forced
onto a --draft_window ring), driven the way the generator drives it, every attention output checked per layer.

The real code runs: Model.from_config (DFlash2Model, draft_window), Cache, SlidingAttention.decode_flash_attn for
each layer of a block forward, advance_recurrent_states, the real dflash_update_kv_from_target (the prefill chunks
and the verified write-back after each round: ring plan, per-layer write, commit), SWAState.rewind and the
checkpoint round trip (stash, free, new_from_stashed). Only what cannot run on CPU is replaced: the projections
(random K/V/Q rows from the payload seed; RoPE the identity) and the paged-attention kernel (a torch reference,
test infrastructure, that appends and reads rows exactly through the block table and sequence lengths it is
given).

The reference is unbounded and per layer: every layer keeps the K/V of every absolute position it was given, and a
row's expected output is attention over that layer's own window (sliding_window keys back, window_right ahead
inside the block) of that history. An output is a mismatch unless it is bit-identical (same rows, same order,
same math).

payload: {"seed": int, "layer_types": [...], "window": int (checkpoint sliding_window), "draft_window": int|null,
          "ring": bool, "bsz": int, "steps": int, "big": [int, ...] (prefill chunk sizes drawn now and then,
          larger than a ring), "env": {...}, "device": "cpu"|"cuda", "kernels": "reference"|"real", "graphed": bool,
          "tol": float}, or {"cases": [payload, ...]}
On a GPU (scripts/device/exllamav3_check.py) "kernels": "real" keeps upstream's Triton decode kernel: an output is then
a mismatch when it is off the reference by more than "tol" (default 0.02; a row read from the wrong position is off
by about 1), and "graphed": true leaves the graphed decode step on (see _ring_ref.attention_kernels).
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

from _common import run_cases
from _ring_ref import HKV, HQ, PAGE, attend, attention_kernels, decode_reference, visible

D = 16
HIDDEN = 4 * D


ref_decode = decode_reference(head_dim=D)


def case(P: dict[str, Any]) -> dict[str, Any]:
    if P.get("ring"):
        os.environ["EXL3_OVL_SWA_RING"] = "1"
    else:
        os.environ.pop("EXL3_OVL_SWA_RING", None)
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    import torch
    from _common import tiny_dflash2
    from exllamav3 import Cache, Config, Model
    from exllamav3.cache.recurrent_util import advance_recurrent_states
    from exllamav3.modules import sliding_attn

    graphed_served = attention_kernels(P, ref_decode, sliding_attn)
    device = torch.device(P.get("device", "cpu"))
    # reference kernels: bit for bit; upstream's kernels (a GPU): within a tolerance (a wrong row is off by ~1)
    tol = float(P.get("tol", 2e-2)) if P.get("kernels", "reference") == "real" else 0.0
    max_abs = 0.0
    rnd = random.Random(P["seed"])
    gen = torch.Generator().manual_seed(P["seed"])
    bsz = P.get("bsz", 1)
    types = P["layer_types"]

    with tempfile.TemporaryDirectory() as tmp:
        directory = tiny_dflash2(
            Path(tmp) / "d",
            layers=len(types),
            layer_types=types,
            window=P.get("window", 256),
            hidden=HIDDEN,
            kv_heads=HKV,
            head_dim=D,
        )
        config = Config.from_directory(str(directory))
        kwargs = {"draft_window": P["draft_window"]} if P.get("draft_window") else {}
        model = Model.from_config(config, **kwargs)
        causal = config.is_causal is True  # what DFlash2Model.prepare_inputs passes the layers
        cache = Cache(model, max_num_tokens=PAGE, max_batch_size=bsz + 1)
        layers = model.attn_modules
        assert all(isinstance(L, sliding_attn.SlidingAttention) for L in layers), [
            type(L).__name__ for L in layers
        ]

        pending: dict[int, tuple[Any, ...]] = {}
        projected: dict[int, list[Any]] = {}

        def identity_rope(a: Any, b: Any, *args: Any, **kw: Any) -> Any:
            return a, b

        def kv_proj(i: int, which: int) -> Any:
            def forward(x: Any, params: Any, out_dtype: Any = None) -> Any:
                rows = torch.randn(x.shape[0], x.shape[1], HKV * D, generator=gen).half()
                projected.setdefault(i, [None, None])[which] = rows.view(x.shape[0], x.shape[1], HKV, D)
                return rows.to(x.device)

            return SimpleNamespace(forward=forward)

        model.input_layer.device = device
        model.input_layer.proj = SimpleNamespace(forward=lambda x, params, out_dtype=None: x[..., :HIDDEN])
        model.input_layer.norm = SimpleNamespace(forward=lambda x, params, out_dtype=None: x)
        for i, L in enumerate(layers):
            L.device = device
            L.q_norm = L.k_norm = L.v_norm = None
            L.rope = SimpleNamespace(apply=identity_rope)
            L.k_norm_tensor, L.norm_eps, L.norm_constant_bias = None, 1e-6, 0.0
            L.project_o = lambda o, b_, s_, p_: o
            L.project_qkv = (lambda i: lambda x, params: pending.pop(i))(i)  # noqa: B023 (bound by the outer call)
            L.k_proj, L.v_proj = kv_proj(i, 0), kv_proj(i, 1)
        for state_layer in cache.recurrent_layers.values():
            state_layer.alloc(device)

        states = [cache.get_new_state() for _ in range(bsz)]
        floors = [0] * bsz
        zero = torch.zeros(HKV, D).half()
        hist: list[list[tuple[list[Any], list[Any]]]] = [
            [([], []) for _ in range(bsz)] for _ in layers
        ]  # per layer, per row: (keys, values) by position
        mismatches = [0] * len(layers)
        checked = [0] * len(layers)
        counts = {"prefill": 0, "big_prefill": 0, "round": 0, "rewind": 0, "stash": 0}
        digests = []
        errors = []

        def record(i: int, b: int, pos0: int, keys: Any, values: Any, n: int) -> None:
            # rows [pos0, pos0 + n) of layer i, row b; a cropped projection (0006) gave only the last rows
            m = keys.shape[0]
            hk, hv = hist[i][b]
            del hk[pos0:], hv[pos0:]
            hk += [zero] * (n - m) + list(keys)
            hv += [zero] * (n - m) + list(values)

        def update(lengths: list[int] | None, n: int, pos: list[int] | None = None) -> None:
            """The real write-back, dflash_update_kv_from_target, at the rows' positions (default: their ends)"""
            pos = pos or [rs.position for rs in states]
            taps = [torch.randn(bsz, n, HIDDEN, generator=gen).half().to(device) for _ in range(2)]
            params = {
                "block_table": None,
                "cache_seqlens": torch.tensor(pos, dtype=torch.int32),
                "recurrent_states": states,
            }
            projected.clear()
            model.update_kv_from_target(taps, cache, params, lengths)
            for i in range(len(layers)):
                keys, values = projected[i]
                for b in range(bsz):
                    nb = n if lengths is None else lengths[b]
                    if nb > 0:
                        rows = slice(None) if lengths is None else slice(0, nb)
                        record(i, b, pos[b], keys[b, rows], values[b, rows], nb)

        def block(n: int) -> None:
            """One drafter block forward through every layer, checked per layer, then the states advance"""
            nonlocal max_abs
            p0 = [rs.position for rs in states]
            outs = []
            for i, L in enumerate(layers):
                q = torch.randn(bsz, n, HQ, D, generator=gen).half()
                k = torch.randn(bsz, n, HKV, D, generator=gen).half()
                v = torch.randn(bsz, n, HKV, D, generator=gen).half()
                pending[i] = (q.to(device), k.to(device), v.to(device), None)
                params = {"recurrent_states": states, "causal": causal}
                x = torch.zeros(bsz, n, HIDDEN, device=device)
                o = L.decode_flash_attn(x, bsz, n, params).view(bsz, n, HQ, D).cpu()
                outs.append(o)
                left, right = L.sliding_window, (0 if causal else L.window_right)
                if graphed_served():  # the layer's own projections ran: digests only from here on
                    continue
                for b in range(bsz):
                    record(i, b, p0[b], k[b], v[b], n)
                    hk, hv = hist[i][b]
                    for r in range(n):
                        span = visible(p0[b] + r, p0[b] + n, left, right)
                        want = attend(q[b, r], [hk[j] for j in span], [hv[j] for j in span], L.sm_scale)
                        checked[i] += 1
                        diff = float((want.float() - o[b, r].float()).abs().max())
                        max_abs = max(max_abs, diff)
                        mismatches[i] += int(diff > tol if tol else not torch.equal(want, o[b, r]))
            digests.append(
                hashlib.sha256(b"".join(o.contiguous().numpy().tobytes() for o in outs)).hexdigest()[:16]
            )
            advance_recurrent_states(torch.zeros(bsz, n), {"recurrent_states": states}, model)

        try:
            update(None, rnd.randint(300, 700))
            counts["prefill"] += 1
            for _ in range(P.get("steps", 150)):
                op = rnd.choices(
                    ["prefill", "big_prefill", "round", "rewind", "stash"],
                    [2, 1 if P.get("big") else 0, 12, 2, 1],
                )[0]
                if op == "prefill":
                    update(None, rnd.randint(17, 300))
                elif op == "big_prefill":
                    update(None, rnd.choice(P["big"]))
                elif op == "round":
                    # DFlash round: the drafter appends its block, then the verified rows overwrite it from the
                    # pre-block position (the generator's write-back through dflash_update_kv_from_target)
                    before = [rs.position for rs in states]
                    block(P.get("block", 8))
                    update([rnd.randint(1, P.get("block", 8)) for _ in states], P.get("block", 8), before)
                elif op == "rewind":
                    for b, rs in enumerate(states):
                        rs.rewind(rnd.randint(0, min(8, rs.rollback_capacity(), rs.position - floors[b])))
                elif op == "stash":
                    # checkpoint round trip at a page boundary: stash, free, restore into a fresh slot
                    b = rnd.randrange(bsz)
                    gap = -states[b].position % PAGE
                    if gap:
                        update([gap if j == b else 0 for j in range(bsz)], gap)
                    rs = states[b]
                    stashed = rs.stash()
                    rs.free()
                    states[b] = cache.new_from_stashed(stashed, rs.position)
                    floors[b] = rs.position
                counts[op] += 1
        except Exception as e:  # a crash is a result (the unfixed mixed rings raise on large chunks)
            errors.append(f"{type(e).__name__}: {e}")

        return {
            "ring": bool(getattr(layers[0], "ring", False)),
            "windows": [[L.sliding_window, L.window_right] for L in layers],
            "kv_state_size": [L.kv_state_size for L in layers],
            "mismatches": mismatches,
            "checked": checked,
            "errors": errors,
            "counts": counts,
            "digests": digests,
            "final_positions": [rs.position for rs in states],
            "max_abs_vs_reference": max_abs,
            "graphed_steps": graphed_served(),
        }


if __name__ == "__main__":
    run_cases(case)
