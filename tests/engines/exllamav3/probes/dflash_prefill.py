"""Probe: DFlash-family K/V update from target hidden states (dflash_update_kv_from_target) over prefill chunks.

The drafter's fc / hidden_norm / k_proj / v_proj / RoPE are CUDA-backed; here they are torch stand-ins (fixed
random fp16 matrices applied by one fp16 matmul each, an RMS norm, and a rotation whose angle depends on the
absolute position the real code hands to RoPE, so a wrong position offset shows). The ring planning and writing
code is the real one. After every chunk the probe reports each layer's visible window (last sliding_window + 1
positions) as digests, the state positions, and how many target rows went through the projections (in all and per
chunk).

payload: {"seed": int, "chunks": [int, ...], "draft_window": int|null, "layer_types": [...], "window": int,
          "env": {"EXL3_OVL_DFLASH_PREFILL_CROP": "1", "EXL3_OVL_SWA_RING": "1"}}, or {"cases": [payload, ...]}

The mechanism census (src/overlay/engines/workers/exllamav3_census_prefill.py, scenario prefill-chunk) runs the same
world through ``prefill(payload, dev=..., around=...)``: the drafter's weights, its window states and the target's
tapped hidden states are then device tensors, each chunk's update runs inside ``around(i)`` (a census step), and the
job's host block table and positions are uploaded by the wheel's own code, as in Job's prefill.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from typing import Any

from _common import run_cases

PAGE = 256  # the generator's page size: the job's block table has one entry per page of the prompt


def case(PAYLOAD: dict[str, Any]) -> dict[str, Any]:
    return prefill(PAYLOAD)


def prefill(
    PAYLOAD: dict[str, Any],
    *,
    dev: Callable[[Any], Any] | None = None,
    around: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None,
) -> dict[str, Any]:
    """Run the payload's chunks through the wheel's update_kv_from_target. ``dev``: makes a host tensor a device
    tensor (the census's ``CensusDev``; the layers' device is then ``cpu:0``); ``around(i)``: a context around chunk
    i's update (nothing else runs inside it)."""
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    import torch
    from _common import tiny_dflash2
    from exllamav3 import Cache, Config, Model
    from exllamav3.modules import sliding_attn

    to_dev: Callable[[Any], Any] = dev if dev is not None else (lambda t: t)
    device = torch.device("cpu", 0) if dev is not None else torch.device("cpu")
    hidden, kvh, hd = 64, 2, 16
    gen = torch.Generator().manual_seed(PAYLOAD["seed"])
    projected = {"fc_rows": 0, "kv_rows": 0}
    per_chunk: list[dict[str, int]] = []

    def linear(w: Any) -> Any:
        w = to_dev(w.half())

        def forward(x: Any, params: Any, out_dtype: Any = None) -> Any:
            key = "fc_rows" if w.shape[0] == 2 * hidden else "kv_rows"
            rows = x.shape[0] * x.shape[1]
            projected[key] += rows
            if per_chunk:
                per_chunk[-1][key] += rows
            return x @ w  # one fp16 GEMM, as the EXL3 linear's kernel (whose weight is quantized)

        return SimpleNamespace(forward=forward)

    def rms(x: Any, params: Any, out_dtype: Any = None) -> Any:
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).half()

    def rope_apply(k: Any, q: Any, position: Any, positions: Any, position_ids: Any, *args: Any) -> Any:
        # rotate channel pairs by an angle that depends on the absolute position of each row
        bsz, n = k.shape[:2]
        pos = positions.view(bsz, 1).float() + torch.arange(n, device=k.device).view(1, n).float()
        ang = (pos * 0.01).view(bsz, n, 1, 1)
        a, b = k[..., 0::2].float(), k[..., 1::2].float()
        # the pairs interleaved again by stack + flatten (an indexed assignment into a device tensor would read, at
        # the dispatch level where the census counts, as a copy into a host view)
        even, odd = a * torch.cos(ang) - b * torch.sin(ang), a * torch.sin(ang) + b * torch.cos(ang)
        return torch.stack((even, odd), dim=-1).flatten(-2).half(), None

    with tempfile.TemporaryDirectory() as tmp:
        types = PAYLOAD.get("layer_types", ["sliding_attention"] * 2)
        directory = tiny_dflash2(
            Path(tmp) / "d",
            layers=len(types),
            layer_types=types,
            window=PAYLOAD.get("window", 256),
            hidden=hidden,
            kv_heads=kvh,
            head_dim=hd,
        )
        kwargs = {"draft_window": PAYLOAD["draft_window"]} if PAYLOAD.get("draft_window") else {}
        model = Model.from_config(Config.from_directory(str(directory)), **kwargs)
        cache = Cache(model, max_num_tokens=256, max_batch_size=2)
        model.input_layer.device = device
        model.input_layer.proj = linear(torch.randn(2 * hidden, hidden, generator=gen) / 8)
        model.input_layer.norm = SimpleNamespace(forward=rms)
        for layer in model.attn_modules:
            layer.device = device
            layer.k_proj = linear(torch.randn(hidden, kvh * hd, generator=gen) / 8)
            layer.v_proj = linear(torch.randn(hidden, kvh * hd, generator=gen) / 8)
            layer.rope = SimpleNamespace(apply=rope_apply)
            layer.k_norm_tensor, layer.norm_eps, layer.norm_constant_bias = None, 1e-6, 0.0
        for state_layer in cache.recurrent_layers.values():
            state_layer.alloc("cpu")
            for name in ("k_state", "v_state"):
                setattr(state_layer, name, to_dev(getattr(state_layer, name)))
        rs = cache.get_new_state()

        def plain(t: Any) -> Any:
            return t.as_subclass(torch.Tensor)  # read back without counting (the census's digests)

        def window_digest(layer: Any) -> str:
            k_states, v_states = map(
                plain, cache.get_recurrent_layer((layer.layer_idx, 0)).get_state_tensors()
            )
            n = min(layer.sliding_window + 1, rs.position - rs.window_beg)
            t0 = rs.position - n
            if getattr(layer, "ring", False):
                k = sliding_attn.ring_read(k_states, rs.slot, t0, n)
                v = sliding_attn.ring_read(v_states, rs.slot, t0, n)
            else:
                k = k_states[rs.slot, t0 - rs.window_beg : rs.position - rs.window_beg]
                v = v_states[rs.slot, t0 - rs.window_beg : rs.position - rs.window_beg]
            return hashlib.sha256(
                k.contiguous().numpy().tobytes() + v.contiguous().numpy().tobytes()
            ).hexdigest()[:16]

        total = sum(PAYLOAD["chunks"])
        after = []
        for i, n in enumerate(PAYLOAD["chunks"]):
            # the target's tapped hidden states (on its device after its forward) and the job's host tensors
            taps = [to_dev(torch.randn(1, n, hidden, generator=gen).half()) for _ in range(2)]
            params = {
                "block_table": torch.arange(-(-total // PAGE), dtype=torch.int32).view(1, -1),
                "cache_seqlens": torch.tensor([rs.position], dtype=torch.int32),
                "recurrent_states": [rs],
            }
            per_chunk.append({"fc_rows": 0, "kv_rows": 0})
            with around(i) if around is not None else contextlib.nullcontext():
                model.update_kv_from_target(taps, cache, params)
            after.append(
                {
                    "position": rs.position,
                    "window_beg": rs.window_beg,
                    "windows": [window_digest(layer) for layer in model.attn_modules],
                }
            )
        return {
            "after": after,
            "projected": projected,
            "per_chunk": per_chunk,
            "kv_state_size": [layer.kv_state_size for layer in model.attn_modules],
        }


if __name__ == "__main__":
    run_cases(case)
