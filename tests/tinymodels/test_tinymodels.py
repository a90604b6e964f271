"""Tiny models: registry, determinism, tokenizer, stock mlx-lm and transformers loading, dead layers, training."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from overlay.check.models import KINDS, PROMPTS, all_prompts, build, model_dir, read_manifest, recipe_hash
from overlay.check.models import common as common_module
from overlay.check.models import recipes as recipes_module
from overlay.check.models import training as training_module
from overlay.check.models.builder import MANIFEST, TIMINGS
from overlay.check.models.common import load_tensors
from overlay.check.models.corpus import CATEGORIES, documents
from overlay.check.models.mlxproc import run_mlx_script
from overlay.check.models.recipes import SLIDING_WINDOW, HeavyRecipe, RandomRecipe
from overlay.check.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, load_tokenizer
from overlay.cli.main import main as overlay_main
from overlay.errors import UsageError
from tinymodels.tiny_support import RANDOM_KINDS, REPO, Interpreter

QWEN_MTP_NAMES = {
    "mtp.fc.weight",
    "mtp.norm.weight",
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.layers.0.input_layernorm.weight",
    "mtp.layers.0.post_attention_layernorm.weight",
    "mtp.layers.0.self_attn.q_proj.weight",
    "mtp.layers.0.self_attn.k_proj.weight",
    "mtp.layers.0.self_attn.v_proj.weight",
    "mtp.layers.0.self_attn.o_proj.weight",
    "mtp.layers.0.self_attn.q_norm.weight",
    "mtp.layers.0.self_attn.k_norm.weight",
    "mtp.layers.0.mlp.gate_proj.weight",
    "mtp.layers.0.mlp.up_proj.weight",
    "mtp.layers.0.mlp.down_proj.weight",
}
PROMPT = "count: one two three four five"


def _model_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file() and p.name != TIMINGS}


# ----------------------------------------------------------------------------------------------- registry, CLI


def test_registry_holds_frozen_recipes() -> None:
    assert set(RANDOM_KINDS) < set(KINDS)
    for kind, recipe in KINDS.items():
        with pytest.raises(dataclasses.FrozenInstanceError):
            recipe.description = "x"  # type: ignore[misc]
        if isinstance(recipe, HeavyRecipe):
            assert recipe.base in KINDS, kind
    assert len({recipe_hash(k) for k in KINDS}) == len(KINDS)
    assert recipe_hash("llama-random", 0) != recipe_hash("llama-random", 1)


def test_unknown_kind_names_the_closest(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="'llama-randm'.*did you mean 'llama-random'"):
        build("llama-randm", root=tmp_path)
    assert not (tmp_path / "build").exists()


def test_cli_list_and_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "overlays").mkdir()
    assert overlay_main(["--root", str(tmp_path), "models", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["version"] == 1
    assert [row["kind"] for row in listed["kinds"]] == list(KINDS)
    assert not any(row["built"] for row in listed["kinds"])
    assert overlay_main(["--root", str(tmp_path), "-q", "models", "build", "llama-draft-random"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == model_dir("llama-draft-random", root=tmp_path)
    assert (printed / "model.safetensors").is_file()
    assert overlay_main(["--root", str(tmp_path), "models", "build", "qwen3_5-rand"]) == 2
    assert "did you mean 'qwen3_5-random'" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- random kinds


def test_random_kinds_are_byte_deterministic(
    random_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    other_root = tmp_path_factory.mktemp("models-b")
    for kind, first in random_models.items():
        second = build(kind, root=other_root)
        assert first.name == second.name == f"{kind}-{recipe_hash(kind)[:12]}"
        assert _model_files(first) == _model_files(second), kind
    reseeded = build("llama-random", root=other_root, seed=1)
    assert reseeded != model_dir("llama-random", root=other_root)
    a = load_tensors(random_models["llama-random"] / "model.safetensors")
    b = load_tensors(reseeded / "model.safetensors")
    assert a.keys() == b.keys()
    assert not np.array_equal(a["model.layers.0.mlp.up_proj.weight"], b["model.layers.0.mlp.up_proj.weight"])


def test_cached_build_is_reused(random_models: dict[str, Path]) -> None:
    path = random_models["llama-random"]
    stamp = (path / MANIFEST).stat().st_mtime_ns
    assert build("llama-random", root=path.parents[2]) == path
    assert (path / MANIFEST).stat().st_mtime_ns == stamp


def test_random_kind_files_and_mtp_tensors(random_models: dict[str, Path]) -> None:
    for kind, path in random_models.items():
        names = {
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            MANIFEST,
            TIMINGS,
        }
        assert {p.name for p in path.iterdir()} == names, kind
        tensors = load_tensors(path / "model.safetensors")
        assert all(t.dtype == np.float32 and np.isfinite(t).all() for t in tensors.values()), kind
        assert read_manifest(path)["tensors"] == len(tensors)

    qwen = load_tensors(random_models["qwen3_5-random"] / "model.safetensors")
    assert {n for n in qwen if n.startswith("mtp.")} == QWEN_MTP_NAMES
    assert qwen["mtp.fc.weight"].shape == (128, 256)
    conv = qwen["model.language_model.layers.0.linear_attn.conv1d.weight"]
    assert conv.shape[1:] == (1, 4)  # HF layout: what makes stock sanitize shift the zero-centred norms
    text = json.loads((random_models["qwen3_5-random"] / "config.json").read_text())["text_config"]
    assert text["mtp_num_hidden_layers"] == 1
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]

    ds_config = json.loads((random_models["deepseek_v3-random"] / "config.json").read_text())
    n = ds_config["num_hidden_layers"]
    assert ds_config["num_nextn_predict_layers"] == 1
    ds = load_tensors(random_models["deepseek_v3-random"] / "model.safetensors")
    for suffix in (
        "enorm.weight",
        "hnorm.weight",
        "eh_proj.weight",
        "shared_head.norm.weight",
        "shared_head.head.weight",
        "embed_tokens.weight",
        "self_attn.kv_b_proj.weight",
        "mlp.experts.0.gate_proj.weight",
        "mlp.shared_experts.down_proj.weight",
        "input_layernorm.weight",
    ):
        assert f"model.layers.{n}.{suffix}" in ds, suffix
    assert ds[f"model.layers.{n}.eh_proj.weight"].shape == (64, 128)
    assert not any(k.startswith(f"model.layers.{n + 1}.") for k in ds)


def test_interrupted_build_leaves_no_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(directory: Path) -> None:
        (directory / "tokenizer.json").write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(common_module, "write_tokenizer", boom)
    with pytest.raises(KeyboardInterrupt):
        build("llama-random", root=tmp_path)
    models = tmp_path / "build" / "models"
    assert not model_dir("llama-random", root=tmp_path).exists()
    assert list((models / ".tmp").iterdir()) == []
    monkeypatch.undo()
    assert (build("llama-random", root=tmp_path) / MANIFEST).is_file()


# ----------------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_the_prompt_set(random_models: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(random_models["llama-random"])
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    assert [tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<pad>")] == [BOS_ID, EOS_ID, PAD_ID]
    assert tuple(PROMPTS) == CATEGORIES == ("code", "prose", "json", "sql", "repetitive")
    texts = [p for _, p in all_prompts()] + documents(25, seed=99) + ["naïve café ∑ 🙂 \t\n"]
    for text in texts:
        ids = tokenizer.encode(text).ids
        assert ids[0] == BOS_ID and BOS_ID not in ids[1:]
        assert tokenizer.decode(ids) == text
    compression = sum(len(t) for t in documents(50)) / sum(
        len(tokenizer.encode(t).ids) for t in documents(50)
    )
    assert compression > 2.0  # merges were learned (bytes alone would give ~1)


# ----------------------------------------------------------------------------------------------- loading


def test_random_kinds_load_in_stock_mlx_lm(random_models: dict[str, Path], mlx_python: Interpreter) -> None:
    texts = [p for _, p in all_prompts()]
    result = mlx_python.probe(
        "mlx_load.py",
        {
            "models": [str(p) for p in random_models.values()],
            "prompt": PROMPT,
            "generate": 6,
            "roundtrip": texts,
        },
    )
    for kind, path in random_models.items():
        r = result[str(path)]
        assert r["finite"], kind
        assert r["shape"] == [1, len(r["prompt_ids"]), VOCAB_SIZE], kind
        assert r["prompt_ids"][0] == BOS_ID
        assert r["eos_token_ids"] == [EOS_ID]
        assert r["roundtrip_ok"], kind
        assert len(r["greedy"]) == 6
        assert not any("mtp" in n or n.startswith("model.layers.61.") for n in r["param_names"]), kind
        assert max(abs(x) for x in r["last_logits"]) > 0.1, kind  # not a degenerate flat model
    assert result[str(random_models["qwen3_5-random"])]["caches"] == ["ArraysCache"] * 3 + ["KVCache"]
    assert result[str(random_models["deepseek_v3-random"])]["caches"] == ["KVCache"] * 61
    # stock keeps everything except the MTP block: 71 tensors - 15 mtp.* = 56 (notes §3)
    assert len(result[str(random_models["qwen3_5-random"])]["param_names"]) == 56


def test_llama_kinds_load_in_transformers_like_mlx(
    random_models: dict[str, Path], mlx_python: Interpreter, hf_python: Interpreter
) -> None:
    paths = [str(random_models["llama-random"]), str(random_models["llama-draft-random"])]
    hf = hf_python.probe("hf_load.py", {"models": paths, "prompt": PROMPT})
    mlx = mlx_python.probe("mlx_load.py", {"models": paths, "prompt": PROMPT, "generate": 1})
    for path in paths:
        assert hf[path]["architecture"] == "LlamaForCausalLM"
        assert hf[path]["finite"] and hf[path]["roundtrip"]
        assert hf[path]["prompt_ids"] == mlx[path]["prompt_ids"]
        diff = max(abs(a - b) for a, b in zip(hf[path]["last_logits"], mlx[path]["last_logits"], strict=True))
        assert diff < 1e-3, (path, diff)  # same conventions (RoPE, norms, tying) in both engines


def test_sliding_window_kind_loads_and_its_window_bites(
    random_models: dict[str, Path], mlx_python: Interpreter, tmp_path: Path
) -> None:
    """olmo3-swa-random (selectable with --target-kind): stock mlx-lm gives its sliding layers a rotating cache of the
    window, the window is shorter than every built-in prompt, and it changes the logits (a copy with a wide window
    does not agree)."""
    path = random_models["olmo3-swa-random"]
    config = json.loads((path / "config.json").read_text())
    tok = load_tokenizer(path)
    lengths = [len(tok.encode(text).ids) for _, text in all_prompts()]
    assert config["sliding_window"] == SLIDING_WINDOW < min(lengths) <= len(tok.encode(PROMPT).ids)
    assert config["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    wide = tmp_path / "wide"
    shutil.copytree(path, wide)
    (wide / "config.json").write_text(json.dumps({**config, "sliding_window": 64}))
    mlx = mlx_python.probe("mlx_load.py", {"models": [str(path), str(wide)], "prompt": PROMPT, "generate": 2})
    ours = mlx[str(path)]
    assert ours["caches"] == ["RotatingKVCache"] * 3 + ["KVCache"] and ours["finite"]
    widened = max(abs(a - b) for a, b in zip(ours["last_logits"], mlx[str(wide)]["last_logits"], strict=True))
    assert widened > 0.1, widened  # the window is what the model computes with


@pytest.mark.long  # torch + transformers import: 20-50 s on 2 shared cores
def test_sliding_window_kind_means_the_same_in_transformers(
    random_models: dict[str, Path], mlx_python: Interpreter, hf_python: Interpreter
) -> None:
    """The window (the current token included) means the same in transformers and mlx-lm: equal logits."""
    path = str(random_models["olmo3-swa-random"])
    hf = hf_python.probe("hf_load.py", {"models": [path], "prompt": PROMPT})[path]
    mlx = mlx_python.probe("mlx_load.py", {"models": [path], "prompt": PROMPT, "generate": 1})[path]
    assert hf["architecture"] == "Olmo3ForCausalLM" and hf["prompt_ids"] == mlx["prompt_ids"]
    assert max(abs(a - b) for a, b in zip(hf["last_logits"], mlx["last_logits"], strict=True)) < 1e-3


def test_dead_layers_keep_logits_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlx_python: Interpreter
) -> None:
    """The heavy mechanism on random bases (the shipped heavy kinds derive from trained ones)."""
    monkeypatch.setitem(
        recipes_module._KINDS, "test-llama-heavy", HeavyRecipe("test", base="llama-random", extra_layers=3)
    )
    monkeypatch.setitem(
        recipes_module._KINDS, "test-qwen-heavy", HeavyRecipe("test", base="qwen3_5-random", extra_layers=4)
    )
    pairs = [
        (build("llama-random", root=tmp_path), build("test-llama-heavy", root=tmp_path)),
        (build("qwen3_5-random", root=tmp_path), build("test-qwen-heavy", root=tmp_path)),
    ]
    result = mlx_python.probe(
        "mlx_load.py", {"models": [str(p) for pair in pairs for p in pair], "prompt": PROMPT, "generate": 12}
    )
    for base, heavy in pairs:
        assert result[str(heavy)]["last_logits"] == result[str(base)]["last_logits"]
        assert result[str(heavy)]["greedy"] == result[str(base)]["greedy"]
        assert result[str(heavy)]["parameters"] > result[str(base)]["parameters"]
    assert len(result[str(pairs[1][1])]["caches"]) == 8
    heavy_tensors = load_tensors(pairs[1][1] / "model.safetensors")
    assert {n for n in heavy_tensors if n.startswith("mtp.")} == QWEN_MTP_NAMES
    assert not heavy_tensors["model.language_model.layers.5.linear_attn.out_proj.weight"].any()
    assert heavy_tensors["model.language_model.layers.5.linear_attn.in_proj_qkv.weight"].any()


# ----------------------------------------------------------------------------------------------- trained kinds


def test_trained_kind_without_mlx_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot run the interpreter .*nope") as info:
        build("llama-draft", root=tmp_path, python=tmp_path / "nope")
    assert info.value.tip and "--python" in info.value.tip
    if importlib.util.find_spec("mlx") is None:  # the overlay venv: no mlx, and no python= given
        with pytest.raises(
            UsageError, match="llama-heavy derives from llama-target: .* cannot import mlx and mlx_lm"
        ):
            build("llama-heavy", root=tmp_path)
        with pytest.raises(UsageError, match=f"{sys.executable} cannot import mlx and mlx_lm"):
            build("llama-draft", root=tmp_path, python=Path(sys.executable))
    scratch = tmp_path / "build" / "models" / ".tmp"
    assert not scratch.exists() or not any(scratch.iterdir())
    assert not model_dir("llama-draft", root=tmp_path).exists()


def test_llama_draft_trains(tmp_path: Path, mlx_python: Interpreter) -> None:
    """The fastest trained kind, built for real: loss goes down and the model learned the corpus."""
    path = build("llama-draft", root=tmp_path, python=mlx_python.python)
    manifest = read_manifest(path)
    losses = manifest["training"]["target"]["losses"]
    assert losses[0] > 5.0 and losses[-1] < losses[0] / 4, losses
    assert all(math.isfinite(x) for x in losses)
    assert manifest["trained_with"]["mlx_lm"] == "0.32.2"
    result = mlx_python.probe(
        "mlx_load.py", {"models": [str(path)], "prompt": "CREATE TABLE products (id", "generate": 12}
    )[str(path)]
    assert result["decoded"].startswith(" INTEGER, name TEXT, price"), result["decoded"]


def test_training_task_reports_falling_loss(
    tmp_path: Path, random_models: dict[str, Path], mlx_python: Interpreter
) -> None:
    """The qwen3_5 training path (gated-delta layers through stock classes), a few steps only."""
    model = random_models["qwen3_5-random"]
    data = tmp_path / "tokens.npy"
    np.save(
        data,
        training_module.training_tokens(
            recipes_module.TrainSpec(steps=1, batch_size=1, seq_len=8, learning_rate=0.0, corpus_docs=200)
        ),
    )
    spec = {
        "steps": 12,
        "batch_size": 4,
        "seq_len": 16,
        "learning_rate": 3e-3,
        "warmup_steps": 2,
        "min_lr_ratio": 0.1,
        "weight_decay": 0.0,
        "grad_clip": 1.0,
        "corpus_docs": 200,
        "passes": 1,
    }
    result = run_mlx_script(
        mlx_python.python,
        {
            "task": "train_lm",
            "model": str(model),
            "data": str(data),
            "spec": spec,
            "seed": 0,
            "out": str(tmp_path / "out.safetensors"),
        },
        "qwen3_5 smoke training",
    )
    assert result["losses"][-1] < result["losses"][0], result["losses"]
    trained = load_tensors(tmp_path / "out.safetensors")
    assert "language_model.model.layers.0.linear_attn.A_log" in trained
    hf = training_module._from_mlx_qwen35(trained)
    original = load_tensors(model / "model.safetensors")
    assert set(hf) == {n for n in original if not n.startswith("mtp.")}
    assert all(hf[n].shape == original[n].shape for n in hf)


@pytest.mark.long  # ~2 minutes on 2 cores (the trained build); the mlx-lm MTP tests (long) use the same model
def test_qwen3_5_mtp_head_is_accepted(mlx_python: Interpreter) -> None:
    """The trained MTP head drafts tokens the target accepts (reference speculative loop, greedy, k=1 and 3).

    Builds qwen3_5-mtp into the repository cache (minutes the first time)."""
    from overlay.check.models.tokenizer import train_tokenizer

    path = build("qwen3_5-mtp", root=REPO, python=mlx_python.python)
    tokenizer = train_tokenizer()
    prompts = [tokenizer.encode(PROMPTS[c][0]).ids for c in CATEGORIES]
    result = run_mlx_script(
        mlx_python.python,
        {"task": "measure_mtp", "model": str(path), "prompts": prompts, "max_tokens": 24, "k": [1, 3]},
        "MTP acceptance",
    )
    for k in ("1", "3"):
        assert result["k"][k]["identical_to_serial"] == len(prompts)
    assert result["k"]["1"]["acceptance_rate"] > 0.4, result
    assert result["k"]["3"]["acceptance_length"] > 1.5, result


def test_random_recipe_shapes_are_what_the_docs_say() -> None:
    llama = KINDS["llama-random"]
    assert isinstance(llama, RandomRecipe)
    assert (llama.shape.hidden_size, llama.shape.num_hidden_layers) == (64, 2)
    draft = KINDS["llama-draft-random"]
    assert isinstance(draft, RandomRecipe)
    assert draft.shape.num_hidden_layers < llama.shape.num_hidden_layers
