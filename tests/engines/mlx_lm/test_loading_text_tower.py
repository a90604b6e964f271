"""Text-tower-only loading (patch text-tower-load): stock vs patched on a sharded multimodal checkpoint.

The tiny qwen3_5 checkpoint of probes/mtp_build.py, resharded with an index: two text shards, one ``mtp.*``-only
shard and one ``model.visual.*``-only shard, and a ``vision_config`` (probes/loading_text_tower.py). Files read are
the paths load_model passes to ``mx.load``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_mtp_loading import build_families

from overlay.check.envs import Arms

PROBE = Path(__file__).parent / "probes" / "loading_text_tower.py"
TOKENS = [1, 5, 9, 13, 17, 21]
TEXT = ["model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors"]
MTP = "model-00003-of-00004.safetensors"
VISUAL = "model-00004-of-00004.safetensors"
CONFIGS: list[Any] = [None, {"text_only": False}, {"keep_mtp": True}]


@pytest.fixture(scope="module")
def vlm(arms: Arms, repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    src = build_families(arms, repo_root)["qwen3_5"]["dir"]
    dst = tmp_path_factory.mktemp("vlm") / "qwen3_5-vlm"
    shards = arms.stock.run_json(PROBE, {"mode": "make", "src": src, "dst": str(dst)})["shards"]
    load = {"mode": "load", "dir": str(dst), "tokens": TOKENS}
    return {
        "shards": shards,
        "stock": arms.stock.run_json(PROBE, {**load, "configs": [None]})[0],
        "patched": arms.patched.run_json(PROBE, {**load, "configs": CONFIGS}),
        "env_off": arms.patched.run_json(
            PROBE, {**load, "configs": [None], "env": {"MLX_LM_TEXT_ONLY": "0"}}
        )[0],
        "guard": arms.patched.run_json(PROBE, {"mode": "guard", "dir": str(dst)}),
    }


def test_text_tower_skips_vision_shard(vlm: dict[str, Any]) -> None:
    assert all(k.startswith("model.visual.") for k in vlm["shards"][VISUAL])
    stock = vlm["stock"]
    default, text_only_off, keep_mtp = vlm["patched"]
    assert stock["files_read"] == sorted(TEXT + [MTP, VISUAL])
    # Default for a config with vision_config: the visual-only and mtp-only shards are not read.
    assert default["files_read"] == TEXT
    # Bit-identical model: same parameters and logits.
    assert default["logits"] == stock["logits"]
    assert (default["params"], default["params_digest"]) == (stock["params"], stock["params_digest"])
    # Off switch (config or environment): stock loading.
    assert text_only_off == stock
    assert vlm["env_off"] == stock
    # keep_mtp reads the mtp shard too, still not the vision tower.
    assert keep_mtp["files_read"] == sorted(TEXT + [MTP])
    assert keep_mtp["has_mtp"] and keep_mtp["logits"] == stock["logits"]


def test_text_tower_keeps_owned_towers(vlm: dict[str, Any]) -> None:
    # A model with parameters under `visual` (one that keeps its vision tower) still reads that shard.
    assert vlm["guard"]["kept"] == sorted(TEXT + [VISUAL])
