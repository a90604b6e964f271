"""The ``deepseek_v3-nextn-random`` kind: a tiny DeepSeek-V3 whose NextN layer drafts for it (SGLang's NEXTN path).

Shapes, config keys, the three choices of the recipe and reproducible bytes; the engine run itself is
tests/engines/sglang/test_nextn.py (long).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from overlay.check.models import KINDS, build, nextn, read_manifest, recipe_hash
from overlay.check.models import weights as W
from overlay.check.models.builder import TIMINGS
from overlay.check.models.common import load_tensors
from overlay.check.models.recipes import NextnRecipe, base_arch, is_nextn, is_trained

KIND = "deepseek_v3-nextn-random"
# model.safetensors of seed 0: the checkpoint docs/engines/sglang.md's NEXTN figures were measured on
SAFETENSORS_SHA256 = "0dddafd9b853bb1d0f7bc5fe9913af4a0313a82dd17a7ab55759d87f7cff75ad"
NEXTN_ONLY = (
    "enorm.weight",
    "hnorm.weight",
    "eh_proj.weight",
    "shared_head.norm.weight",
    "shared_head.head.weight",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(KIND, root=tmp_path_factory.mktemp("nextn-a"))


def _recipe() -> NextnRecipe:
    recipe = KINDS[KIND]
    assert isinstance(recipe, NextnRecipe)
    return recipe


def test_registry_marks_only_the_nextn_kind() -> None:
    assert [k for k in KINDS if is_nextn(k)] == [KIND]
    assert not is_nextn(None) and not is_nextn("no-such-kind")
    assert not is_trained(KIND) and base_arch(KIND) == "deepseek_v3"
    # its own directory: never the deepseek_v3-random cache
    assert recipe_hash(KIND) != recipe_hash("deepseek_v3-random")


def test_config_is_what_sglangs_cpu_path_needs(built: Path) -> None:
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (config["num_hidden_layers"], config["first_k_dense_replace"]) == (2, 1)
    assert config["num_nextn_predict_layers"] == 1
    rope = config["rope_scaling"]
    assert rope["type"] == "yarn" and rope["factor"] == 1.0  # get_rope_cpu asserts on None
    assert rope["original_max_position_embeddings"] == config["max_position_embeddings"]
    base = W.deepseek_v3_config(_recipe().shape)
    assert {k: v for k, v in config.items() if k != "rope_scaling"} == {
        k: v for k, v in base.items() if k != "rope_scaling"
    }


def test_layers_and_the_nextn_layer(built: Path) -> None:
    tensors = load_tensors(built / "model.safetensors")
    assert "model.layers.0.mlp.gate_proj.weight" in tensors  # dense
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in tensors  # MoE
    assert "model.layers.2.mlp.experts.0.up_proj.weight" in tensors  # the NextN layer is MoE
    assert not any(n.startswith("model.layers.3.") for n in tensors)
    for suffix in NEXTN_ONLY:
        assert f"model.layers.2.{suffix}" in tensors and f"model.layers.1.{suffix}" not in tensors
    assert np.array_equal(tensors["model.layers.2.shared_head.head.weight"], tensors["lm_head.weight"])
    eye = np.eye(64, dtype=np.float32)
    assert np.array_equal(tensors["model.layers.2.eh_proj.weight"], np.concatenate([eye, 0.25 * eye], axis=1))
    manifest = read_manifest(built)
    assert manifest["mtp"] == {"style": "deepseek_v3", "num_layers": 1}
    assert manifest["mtp_layer_prefix"] == "model.layers.2."
    assert set(manifest["mtp_tensors"]) == {n for n in tensors if n.startswith("model.layers.2.")}


def test_branch_gain_applies_to_the_target_layers_only(built: Path) -> None:
    tensors = load_tensors(built / "model.safetensors")
    plain = W.deepseek_v3_weights(_recipe().shape, W.Init(0, 1.0))
    for name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.experts.2.down_proj.weight"):
        assert np.array_equal(tensors[name], plain[name] * np.float32(0.5)), name
    for name in (
        "model.layers.2.self_attn.o_proj.weight",
        "model.layers.2.mlp.shared_experts.down_proj.weight",
    ):
        assert np.array_equal(tensors[name], plain[name]), name
    assert np.array_equal(
        tensors["model.layers.0.mlp.up_proj.weight"], plain["model.layers.0.mlp.up_proj.weight"]
    )


def test_bytes_are_reproducible_and_pinned(built: Path, tmp_path: Path) -> None:
    again = build(KIND, root=tmp_path)
    assert again.name == built.name
    files = sorted(p.name for p in built.iterdir() if p.name != TIMINGS)
    assert files == sorted(p.name for p in again.iterdir() if p.name != TIMINGS)
    for name in files:
        assert (built / name).read_bytes() == (again / name).read_bytes(), name
    assert hashlib.sha256((built / "model.safetensors").read_bytes()).hexdigest() == SAFETENSORS_SHA256
    config, tensors = nextn.config_and_tensors(_recipe())
    assert sorted(tensors) == sorted(load_tensors(built / "model.safetensors"))
    assert config == json.loads((built / "config.json").read_text())


def test_editing_the_recipe_gives_a_new_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    from overlay.check.models import recipes as recipes_module

    before = recipe_hash(KIND)
    monkeypatch.setitem(recipes_module._KINDS, KIND, dataclasses.replace(_recipe(), eh_alpha=0.5))
    assert recipe_hash(KIND) != before
