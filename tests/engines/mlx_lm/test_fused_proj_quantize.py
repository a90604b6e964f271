"""``MLX_LM_FUSED_PROJ=1`` then quantization (``mlx_lm.convert -q``) keeps no full-precision copy (patch models:
concatenate sibling projections at load).

The concatenations made at load are held by the modules; ``nn.quantize`` replaces the layers, so the fused path no
longer applies, but the unquantized concatenations stayed referenced (review: 4.8x active memory). Probe:
probes/fused_quant_memory.py loads the tiny fp32 qwen3 lazily, quantizes to 4 bits, evaluates, collects garbage and
measures ``mx.get_active_memory()``. With the variable set the memory must equal the run without it (and stock),
no concatenation may remain, and the quantized logits are the same.
"""

from __future__ import annotations

from pathlib import Path

from overlay.check.envs import Arms

PROBE = Path(__file__).parent / "probes" / "fused_quant_memory.py"


def test_quantize_after_fusion_frees_the_fp_weights(arms: Arms, models: dict[str, str]) -> None:
    stock = arms.stock.run_json(PROBE, {"model": models["qwen3"]})
    off = arms.patched.run_json(PROBE, {"model": models["qwen3"], "env": {"MLX_LM_FUSED_PROJ": "0"}})
    on = arms.patched.run_json(PROBE, {"model": models["qwen3"], "env": {"MLX_LM_FUSED_PROJ": "1"}})
    assert on["fused_groups"] == 0 and on["fused_bytes"] == 0
    assert on["param_bytes"] == off["param_bytes"] == stock["param_bytes"]
    assert on["active_memory"] <= off["active_memory"] * 1.05, (on["active_memory"], off["active_memory"])
    assert on["logits"] == off["logits"] == stock["logits"]
