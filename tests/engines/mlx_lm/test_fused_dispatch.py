"""Fewer ops per token in mlx-lm: stock vs patched on the same tiny models (fixed-seed random fp32 weights).

One probe process per arm and setting runs every case (probes/fused_models.py): the stock arm, the patched arm with
its defaults (exact fusions on, opt-in patches switched on per case), and the patched arm with every kill-switch set,
which must be stock again. Primitive counts come from ``mx.export_to_dot`` of one greedy ``generate_step`` decode
step; they are deterministic, so the tests assert that each fusion lowers them. Timings are in
scripts/bench_mlx_fused.py, never here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

PROBE = Path(__file__).parent / "probes" / "fused_models.py"

# Families whose decoder block goes through the compiled residual-add + RMSNorm.
NORM_FAMILIES = (
    "llama",
    "llama3_rope",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5",
    "deepseek_v3",
    "glm4_moe",
    "deepseek_v32",
    "glm_moe_dsa",
)
ROPE_FAMILIES = ("llama", "llama3_rope", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "glm4_moe")
PROJ_FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "glm4_moe")
GDN_FAMILIES = ("qwen3_next", "qwen3_5")
DSA_FAMILIES = ("deepseek_v32", "glm_moe_dsa")

GREEDY = [[0, 16, 32], [1, 24, 32], [2, 8, 32]]  # [prompt seed, prompt length, tokens]
# Continuous batching (server path: batched caches, array offsets, padding masks): prompts of unequal length.
BATCH = [[0, 16], [1, 9], [2, 23]]
BATCH_FAMILIES = ("llama", "qwen3", "qwen3_5", "qwen3_next", "glm4_moe")
TOGGLES = {
    "norm": {"mlx_lm.models.fused_ops:FUSED_NORM": False},
    "rope": {"mlx_lm.models.fused_ops:FUSED_ROPE": False},
    "gdn": {"mlx_lm.models.gated_delta:_FUSED_GDN_STEP": False},
    "head": {"mlx_lm.sample_head:COMPILED_HEAD": False},
}
KILL_SWITCHES = {
    "MLX_LM_FUSED_NORM": "0",
    "MLX_LM_FUSED_ROPE": "0",
    "MLX_LM_FUSED_GDN": "0",
    "MLX_LM_COMPILED_HEAD": "0",
    "MLX_LM_FUSED_SAMPLER": "0",
}
PROJ_TOL = 1e-4  # fp32 max-abs logits tolerance of the weight-concatenation patch
DEQUANT_TOL = 1e-4
INDEXER_TOL = 1e-5


def _base_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = [
        {
            "id": fam,
            "family": fam,
            "count": True,
            "prompt_len": 24,
            "steps": 10,
            "greedy": GREEDY,
            "batch": BATCH if fam in BATCH_FAMILIES else None,
        }
        for fam in NORM_FAMILIES
    ]
    cases += [
        {"id": f"dsa-{fam}", "family": fam, "prompt_len": 700, "chunk": 350, "steps": 6, "index_sets": True}
        for fam in DSA_FAMILIES
    ]
    cases.append(
        {
            "id": "llama-q4",
            "family": "llama",
            "quantize": {"group_size": 32, "bits": 4},
            "prompt_len": 300,
            "steps": 8,
            "greedy": [[0, 200, 16]],
        }
    )
    cases.append(
        {
            "id": "spec",
            "family": "llama",
            "spec": {"drafts": ["llama", "llama_draft"], "k": 3, "tokens": 32, "prompts": [[0, 16], [1, 24]]},
        }
    )
    return cases


def _patched_cases() -> list[dict[str, Any]]:
    cases = _base_cases()
    for case in cases:
        if case.get("count"):
            case["count_toggles"] = TOGGLES
    cases += [
        {
            "id": f"{fam}-proj",
            "family": fam,
            "env": {"MLX_LM_FUSED_PROJ": "1"},
            "count": True,
            "prompt_len": 24,
            "steps": 10,
            "greedy": GREEDY,
        }
        for fam in PROJ_FAMILIES
    ]
    cases += [
        {
            "id": f"dsa-{fam}-pre",
            "family": fam,
            "globals": {"mlx_lm.models.deepseek_v32:_INDEXER_PRESELECT": True},
            "prompt_len": 700,
            "chunk": 350,
            "steps": 6,
            "index_sets": True,
        }
        for fam in DSA_FAMILIES
    ]
    cases.append(
        {
            "id": "llama-q4-dequant",
            "family": "llama",
            "quantize": {"group_size": 32, "bits": 4},
            "env": {"MLX_LM_PREFILL_DEQUANT": "1"},
            "prompt_len": 300,
            "steps": 8,
            "greedy": [[0, 200, 16]],
        }
    )
    return cases


@pytest.fixture(scope="module")
def runs(arms: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("fused-models")
    out = tmp_path_factory.mktemp("fused-out")
    stock = arms.stock.run_json(PROBE, {"root": str(root), "out": str(out / "stock"), "cases": _base_cases()})
    patched = arms.patched.run_json(
        PROBE, {"root": str(root), "out": str(out / "patched"), "cases": _patched_cases()}
    )
    off = arms.patched.run_json(
        PROBE, {"root": str(root), "out": str(out / "off"), "cases": _base_cases()}, extra_env=KILL_SWITCHES
    )
    return {"stock": stock["cases"], "patched": patched["cases"], "off": off["cases"]}


def _logits(case: dict[str, Any]) -> np.ndarray:
    logits: np.ndarray = np.load(case["logits"])
    return logits


def _assert_bit_exact(a: dict[str, Any], b: dict[str, Any], what: str) -> None:
    la, lb = _logits(a), _logits(b)
    assert la.shape == lb.shape
    diff = float(np.abs(la - lb).max())
    assert np.array_equal(la, lb), f"{what}: logits differ (max abs {diff:.3g})"
    assert a["greedy"] == b["greedy"], f"{what}: greedy tokens differ"
    if "batch_logprobs" in a or "batch_logprobs" in b:
        assert a["batch_tokens"] == b["batch_tokens"], f"{what}: batched tokens differ"
        assert np.array_equal(np.load(a["batch_logprobs"]), np.load(b["batch_logprobs"])), (
            f"{what}: batched logprobs"
        )


def _assert_close(a: dict[str, Any], b: dict[str, Any], tol: float, what: str) -> float:
    la, lb = _logits(a), _logits(b)
    diff = float(np.abs(la - lb).max())
    assert diff <= tol, f"{what}: logits max abs {diff:.3g} > {tol}"
    assert (la.argmax(-1) == lb.argmax(-1)).all(), f"{what}: top-1 differs"
    assert a["rollout_tokens"] == b["rollout_tokens"], f"{what}: rollout tokens differ"
    assert a["greedy"] == b["greedy"], f"{what}: greedy tokens differ"
    return diff


@pytest.mark.slow
def test_fused_add_rmsnorm(runs: dict[str, dict[str, Any]]) -> None:
    """P: compiled residual add + RMSNorm: bit-exact, fewer primitives per decode step in every family."""
    for fam in NORM_FAMILIES:
        s, p = runs["stock"][fam], runs["patched"][fam]
        _assert_bit_exact(s, p, fam)
        assert p["toggled"]["norm"] > p["primitives"], f"{fam}: the add+RMSNorm fusion removed no primitive"
        assert p["primitives"] < s["primitives"]


@pytest.mark.slow
def test_fused_qk_norm_rope(runs: dict[str, dict[str, Any]]) -> None:
    """P: one compiled q/k-norm + RoPE call per single-token step: bit-exact, fewer primitives."""
    for fam in ROPE_FAMILIES:
        s, p = runs["stock"][fam], runs["patched"][fam]
        _assert_bit_exact(s, p, fam)
        assert p["toggled"]["rope"] > p["primitives"], (
            f"{fam}: the q/k norm + RoPE fusion removed no primitive"
        )


@pytest.mark.slow
def test_fused_projections(runs: dict[str, dict[str, Any]]) -> None:
    """P: QKV / gate-up / gated-delta in-projections concatenated at load (opt-in): approximate, fewer primitives."""
    for fam in PROJ_FAMILIES:
        s, p, base = runs["stock"][fam], runs["patched"][f"{fam}-proj"], runs["patched"][fam]
        _assert_close(s, p, PROJ_TOL, f"{fam} with MLX_LM_FUSED_PROJ=1")
        assert p["primitives"] < base["primitives"], f"{fam}: concatenated projections removed no primitive"
    # Off by default: the patched arm without the flag is bit-exact (checked per family above via the base case).
    for fam in PROJ_FAMILIES:
        _assert_bit_exact(runs["stock"][fam], runs["patched"][fam], fam)


@pytest.mark.slow
def test_fused_gated_delta_step(runs: dict[str, dict[str, Any]]) -> None:
    """P: the single-token gated-delta step as one compiled function: bit-exact, fewer primitives."""
    for fam in GDN_FAMILIES:
        s, p = runs["stock"][fam], runs["patched"][fam]
        _assert_bit_exact(s, p, fam)
        assert p["toggled"]["gdn"] > p["primitives"], f"{fam}: the gated-delta fusion removed no primitive"


@pytest.mark.slow
def test_compiled_decode_head(runs: dict[str, dict[str, Any]]) -> None:
    """P: compiled normalize + greedy sample, argmax-only greedy drafts: bit-exact, fewer primitives."""
    for fam in NORM_FAMILIES:
        p = runs["patched"][fam]
        assert p["toggled"]["head"] > p["primitives"], f"{fam}: the compiled head removed no primitive"
    s, p = runs["stock"]["spec"]["spec"], runs["patched"]["spec"]["spec"]
    assert s["runs"] == p["runs"], "speculative decoding: tokens or from-draft flags differ"
    assert any(any(r["from_draft"]) for r in p["runs"]), (
        "no draft token was accepted: the draft path is untested"
    )
    assert p["draft_step_primitives"]["total"] < s["draft_step_primitives"]["total"]


@pytest.mark.slow
def test_indexer_topk_preselect(runs: dict[str, dict[str, Any]]) -> None:
    """P: sparse-attention indexer top-k from block-max candidates (opt-in): identical index sets."""
    for fam in DSA_FAMILIES:
        s, p, base = (
            runs["stock"][f"dsa-{fam}"],
            runs["patched"][f"dsa-{fam}-pre"],
            runs["patched"][f"dsa-{fam}"],
        )
        assert p["applied"], "the patched arm has no indexer preselection switch"
        assert len(s["index_sets"]) == len(p["index_sets"]) > 0
        for fs, fp in zip(s["index_sets"], p["index_sets"]):
            assert np.array_equal(np.load(fs), np.load(fp)), f"{fam}: selected index sets differ ({fs})"
        ls, lp = _logits(s), _logits(p)
        # The prefill builds a mask from the set (order-free): bit-exact. Decode gathers keys in selection order.
        assert np.array_equal(ls[0], lp[0]), f"{fam}: prefill logits differ"
        assert float(np.abs(ls - lp).max()) <= INDEXER_TOL
        assert s["rollout_tokens"] == p["rollout_tokens"]
        assert np.array_equal(ls, _logits(base)), f"{fam}: flag off is not stock"


@pytest.mark.slow
def test_prefill_dequant(runs: dict[str, dict[str, Any]]) -> None:
    """P: dequantize-once for many-row matmuls of a 4-bit model (opt-in): approximate within 1e-4, same tokens."""
    s, p, base = runs["stock"]["llama-q4"], runs["patched"]["llama-q4-dequant"], runs["patched"]["llama-q4"]
    assert "DequantPrefillLinear" in p["layer_types"]
    assert "DequantPrefillLinear" not in base["layer_types"]
    _assert_close(s, p, DEQUANT_TOL, "4-bit llama with MLX_LM_PREFILL_DEQUANT=1")
    _assert_bit_exact(s, base, "4-bit llama, flag off")


@pytest.mark.slow
def test_kill_switches_restore_stock(runs: dict[str, dict[str, Any]]) -> None:
    """Every exact fusion off by its environment switch: logits, tokens and primitive counts are stock's."""
    for case_id, s in runs["stock"].items():
        o = runs["off"][case_id]
        if "logits" in s:
            _assert_bit_exact(s, o, f"{case_id} (kill-switches set)")
        if "primitives" in s:
            assert o["primitives"] == s["primitives"], case_id
        if "spec" in s:
            assert o["spec"] == s["spec"], case_id
