"""Probe: a Gemma4-assistant-style query-only drafter layer (the real SharedKVAttention, attached to a ring source)
reading a target sliding-window layer's ring in the drafter's own forward, after each target decode step, across
many window shifts.

The real code runs: SlidingAttention.decode_flash_attn (the target layer's decode steps, shifting or rotating its
window), advance_recurrent_states (post_advance folds the shift into window_beg), SharedKVAttention.forward and
its _ring_pages (block table and seqlens over the target's ring, passed as params["source_recurrent_states"]).
Replaced: the projections (random rows from the payload seed; q_proj/o_proj of the drafter layer return their
input; RoPE off) and the paged-attention kernel (a torch reference, test infrastructure, that appends and reads
rows exactly through the block table and sequence lengths it is given; with no K/V to append, the query sits at
the last key, as the decode kernel aligns it).

The reference is the target's unbounded history: the drafter's output must be attention over the target's last
sliding_window + 1 keys, bit for bit.

payload: {"seed": int, "steps": int, "window": int, "ring": bool, "bsz": int, "max_step": int, "device": "cpu"|"cuda",
          "kernels": "reference"|"real", "graphed": bool, "tol": float}
On a GPU "kernels": "real" keeps upstream's Triton decode kernel (outputs within "tol" of the reference, default 0.02),
"graphed": true the graphed decode steps (see _ring_ref.attention_kernels).
"""

from __future__ import annotations

import os
import random
from typing import Any

from _common import emit, read_payload
from _ring_ref import HKV, HQ, PAGE, attend, attention_kernels, decode_reference

D = 16
HIDDEN = HQ * D


ref_decode = decode_reference(head_dim=D)


def main() -> None:
    P = read_payload()
    if P.get("ring"):
        os.environ["EXL3_OVL_SWA_RING"] = "1"
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    import torch
    from _common import tiny_dflash2
    from exllamav3 import Cache, Config, Model
    from exllamav3.cache.recurrent_util import advance_recurrent_states
    from exllamav3.modules import shared_kv_attn, sliding_attn
    from exllamav3.modules.shared_kv_attn import SharedKVAttention

    graphed_served = attention_kernels(P, ref_decode, sliding_attn, shared_kv_attn)
    device = torch.device(P.get("device", "cpu"))
    # reference kernels: bit for bit; upstream's kernels (a GPU): within a tolerance (a wrong row is off by ~1)
    tol = float(P.get("tol", 2e-2)) if P.get("kernels", "reference") == "real" else 0.0
    max_abs = 0.0
    rnd = random.Random(P.get("seed", 0))
    gen = torch.Generator().manual_seed(P.get("seed", 0))
    bsz = P.get("bsz", 1)

    with tempfile.TemporaryDirectory() as tmp:
        # the target's sliding-window layer: a SlidingAttention with a window ring (built from a one-layer model)
        directory = tiny_dflash2(
            Path(tmp) / "t",
            layers=1,
            layer_types=["sliding_attention"],
            window=P.get("window", 256),
            hidden=HIDDEN,
            kv_heads=HKV,
            head_dim=D,
        )
        config = Config.from_directory(str(directory))
        config.is_causal = True
        model = Model.from_config(config)
        cache = Cache(model, max_num_tokens=PAGE, max_batch_size=bsz + 1)
        target = model.attn_modules[0]
        target.device = device
        target.q_norm = target.k_norm = target.v_norm = None
        target.rope = None
        target.project_o = lambda o, b_, s_, p_: o
        for state_layer in cache.recurrent_layers.values():
            state_layer.alloc(device)
        states = [cache.get_new_state() for _ in range(bsz)]
        sw = target.sliding_window

        drafter = SharedKVAttention(
            None, "layers.0.self_attn", 0, HIDDEN, D, HQ, HKV, None, sliding_window=sw
        )
        drafter.attach_source("ring", 0, target)
        drafter.device = device
        drafter.q_proj = SimpleNamespace(forward=lambda x, params, out_dtype=None: x.half())
        drafter.o_proj = SimpleNamespace(forward=lambda x, params, out_dtype=None: x)

        hist_k: list[list[Any]] = [[] for _ in range(bsz)]
        hist_v: list[list[Any]] = [[] for _ in range(bsz)]
        pending: list[Any] = []
        target.project_qkv = lambda x, params: pending.pop()
        mismatches, checked, shifts = 0, 0, 0
        examples: list[Any] = []
        for _ in range(P.get("steps", 1200)):
            n = rnd.randint(1, P.get("max_step", 1))
            q = torch.randn(bsz, n, HQ, D, generator=gen).half()
            k = torch.randn(bsz, n, HKV, D, generator=gen).half()
            v = torch.randn(bsz, n, HKV, D, generator=gen).half()
            pending.append((q.to(device), k.to(device), v.to(device), None))
            before = [rs.window_beg for rs in states]
            target.decode_flash_attn(
                torch.zeros(bsz, n, HIDDEN, device=device),
                bsz,
                n,
                {"recurrent_states": states, "causal": True},
            )
            for b in range(bsz):
                hist_k[b] += list(k[b])
                hist_v[b] += list(v[b])
            advance_recurrent_states(torch.zeros(bsz, n), {"recurrent_states": states}, model)
            shifts += sum(rs.window_beg != w for rs, w in zip(states, before))
            # the drafter's forward (a later forward than the target's): one query row per sequence
            x = torch.randn(bsz, 1, HIDDEN, generator=gen).half()
            o = drafter.forward(x.to(device), {"source_recurrent_states": states, "attn_mode": "flash_attn"})
            o = o.view(bsz, 1, HQ, D).cpu()
            if graphed_served():  # the layers' own projections ran: no reference from here on
                continue
            for b, rs in enumerate(states):
                qpos = rs.position - 1
                span = range(max(0, qpos - sw), qpos + 1)
                want = attend(
                    x[b, 0].view(HQ, D),
                    [hist_k[b][j] for j in span],
                    [hist_v[b][j] for j in span],
                    drafter.sm_scale,
                )
                checked += 1
                diff = float((want.float() - o[b, 0].float()).abs().max())
                max_abs = max(max_abs, diff)
                if diff > tol if tol else not torch.equal(want, o[b, 0]):
                    mismatches += 1
                    if len(examples) < 3:
                        examples.append(
                            {"position": rs.position, "window_beg": rs.window_beg, "wshift": rs.wshift}
                        )
        emit(
            {
                "ring": bool(getattr(target, "ring", False)),
                "kv_state_size": target.kv_state_size,
                "checked": checked,
                "mismatches": mismatches,
                "shifts": shifts,
                "examples": examples,
                "final_positions": [rs.position for rs in states],
                "max_abs_vs_reference": max_abs,
                "graphed_steps": graphed_served(),
            }
        )


if __name__ == "__main__":
    main()
