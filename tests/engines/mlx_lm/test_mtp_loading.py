"""MTP re-attachment in mlx-lm (patches mtp-keep-sanitize, mtp-modules, return-hidden): stock vs patched.

One tiny HF-format checkpoint per family (probes/mtp_build.py, built once by the stock arm, cached under
build/models): fixed-seed random fp32 weights in the layout each family's ``sanitize`` expects, plus MTP weights
named like the real checkpoints (Qwen ``mtp.*``, DeepSeek/GLM ``model.layers.{N}``). Three probe runs
(probes/mtp_load.py): stock, patched without keep_mtp, patched with keep_mtp; one more with MLX_LM_KEEP_MTP=1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arms

PROBES = Path(__file__).parent / "probes"
BUILD = PROBES / "mtp_build.py"
LOAD = PROBES / "mtp_load.py"
TOKENS = [1, 5, 9, 13, 17, 21, 25, 29, 33, 37]
VOCAB, HIDDEN = 128, 64
FAMILIES = (
    "deepseek_v3",
    "deepseek_v32",
    "glm_moe_dsa",
    "glm4_moe",
    "glm4_moe_lite",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
)
QWEN_HEAD = {"fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"}
NEXTN_HEAD = {
    "layers.0.eh_proj.weight",
    "layers.0.enorm.weight",
    "layers.0.hnorm.weight",
    "layers.0.shared_head.norm.weight",
}
CACHED_TOL = 1e-5  # fp32: the MTP layer with a KV cache, one position at a time, vs one uncached pass


def build_families(arms: Arms, repo_root: Path) -> dict[str, Any]:
    """The family checkpoints (cached under build/models, shared with the other MTP test modules)."""
    models: dict[str, Any] = arms.stock.run_json(BUILD, {"out": str(repo_root / "build" / "models")})[
        "models"
    ]
    return models


@pytest.fixture(scope="module")
def models(arms: Arms, repo_root: Path) -> dict[str, Any]:
    return build_families(arms, repo_root)


@pytest.fixture(scope="module")
def runs(arms: Arms, models: dict[str, Any]) -> dict[str, Any]:
    payload = {"models": models, "tokens": TOKENS}
    env_models = {f: models[f] for f in ("qwen3_5", "deepseek_v3")}
    return {
        "stock": arms.stock.run_json(LOAD, {**payload, "keep": False}),
        "off": arms.patched.run_json(LOAD, {**payload, "keep": False}),
        "on": arms.patched.run_json(LOAD, {**payload, "keep": True}),
        "env": arms.patched.run_json(
            LOAD, {"models": env_models, "tokens": TOKENS, "keep": False}, extra_env={"MLX_LM_KEEP_MTP": "1"}
        ),
    }


def _main_layer(family: str, info: dict[str, Any]) -> str:
    """Sanitized name prefix of the main layer the tiny MTP layer copies (same tensor set)."""
    if info["style"] == "nextn":
        return f"model.layers.{info['first'] - 1}."
    return "model.layers.3." if family == "qwen3_next" else "language_model.model.layers.3."


def _expected_kept(info: dict[str, Any]) -> int:
    """How many sanitized MTP tensors the raw ones become: shared copies dropped, experts stacked, kv_b split."""
    raw = info["mtp_raw"]
    expert_tensors = sum(".experts." in k for k in raw)
    n = len(raw) - expert_tensors + (3 if info["experts"] else 0)
    if info["style"] == "nextn":
        n -= 2  # embed_tokens and shared_head.head: copies of the target's
    if info["mla"]:
        n += 1  # kv_b_proj -> embed_q + unembed_out
    return n


@pytest.mark.parametrize("family", FAMILIES)
def test_sanitize_keeps_mtp_tensors(family: str, models: dict[str, Any], runs: dict[str, Any]) -> None:
    info = models[family]
    stock = runs["stock"][family]["sanitized"]
    # Flag off: sanitize() gives the stock dict, bit for bit.
    assert runs["off"][family]["sanitized"] == stock
    kept_all = runs["on"][family]["sanitized"]
    mtp = runs["on"][family]["mtp"]
    prefix = mtp["prefix"]
    # Flag on: the main tensors are untouched; the extra ones are exactly the MTP head.
    assert {k: v for k, v in kept_all.items() if not k.startswith(prefix)} == stock
    kept = {k[len(prefix) :] for k in kept_all if k.startswith(prefix)}
    assert len(kept) == _expected_kept(info) > 0
    # Every tensor of the MTP layer is there: the same set as the main layer it mirrors, plus the head's own.
    main = _main_layer(family, info)
    block = {k[len(main) :] for k in stock if k.startswith(main)}
    if info["style"] == "qwen":
        assert kept == {f"layers.0.{k}" for k in block} | QWEN_HEAD
    else:
        assert kept == {f"layers.0.mtp_block.{k}" for k in block} | NEXTN_HEAD
    assert mtp["proj_equal"], "fc / eh_proj must be the checkpoint's tensor"
    assert mtp["norm_shift"], "Qwen MTP norms need the +1 of zero-centred norms (nextn norms: unchanged)"


@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_heads_attach_and_run(family: str, models: dict[str, Any], runs: dict[str, Any]) -> None:
    stock, off, on = runs["stock"][family], runs["off"][family], runs["on"][family]
    # Flag off: parameter tree and logits bit-identical to stock.
    assert off["params"] == stock["params"]
    assert off["logits"] == stock["logits"]
    # Flag on: strict load gave the head a parameter for every kept tensor; the target is unchanged.
    mtp = on["mtp"]
    assert mtp["has_mtp"] and mtp["same_object"]
    assert mtp["module"] == ("QwenMTP" if models[family]["style"] == "qwen" else "NextNMTP")
    assert mtp["names"] == mtp["kept"]
    prefix = mtp["prefix"]
    assert {k: v for k, v in on["params"].items() if not k.startswith(prefix)} == stock["params"]
    assert on["logits"] == stock["logits"]
    # Shared embedding and head: no copies held, and the target's lm_head is what the head uses.
    assert mtp["own_embed_or_head"] == []
    assert mtp["zero_head_max_abs"] == 0.0
    # Shapes, caches, chained steps, trim and redo (what a drafter needs).
    n = len(TOKENS) - 1
    assert mtp["shapes"] == {"logits": [1, n, VOCAB], "hidden": [1, n, HIDDEN]}
    assert mtp["cached_vs_full_max_abs"] <= CACHED_TOL
    assert mtp["cache"]["trimmable"] == [True] and mtp["cache"]["offset"] == [n]
    assert mtp["chained_shape"] == [1, 1, VOCAB]
    assert mtp["trimmed"] == [1] and mtp["redo_equal"]


def test_keep_mtp_from_environment(runs: dict[str, Any]) -> None:
    for family, entry in runs["env"].items():
        assert entry["params"] == runs["on"][family]["params"], family


@pytest.mark.parametrize("family", FAMILIES)
def test_return_hidden(family: str, runs: dict[str, Any]) -> None:
    stock, off, on = runs["stock"][family], runs["off"][family], runs["on"][family]
    # Without return_hidden: the same logits, and `model(x)` builds exactly the graph of `lm_head(inner(x))` from
    # the same modules, as stock's __call__ does (compared within each arm: other patches of the series may fuse
    # ops inside the layers, which is theirs to check).
    assert stock["primitives"] == stock["primitives_inner"]
    assert off["primitives"] == off["primitives_inner"]
    assert off["logits"] == stock["logits"]
    rh = on["mtp"]["return_hidden"]
    assert rh["logits_equal"], "return_hidden=True must not change the logits"
    assert rh["hidden_equal"], "hidden must be the input of lm_head (the inner model's output)"
    assert rh["hidden_shape"] == [1, len(TOKENS), HIDDEN]
