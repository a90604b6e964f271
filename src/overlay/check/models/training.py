"""Trained kinds: the tiny model trained with mlx in another interpreter (:mod:`.mlxproc`) on the bundled corpus,
its parameters converted back to the HF layout; an MTP head, where the recipe has one, trained by distillation."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from overlay.check.models import weights as W
from overlay.check.models.common import (
    BuildContext,
    config_and_tensors,
    load_tensors,
    mtp_details,
    save_tensors,
    write_model_files,
)
from overlay.check.models.corpus import documents
from overlay.check.models.mlxproc import probe_mlx_python, resolve_mlx_python, run_mlx_script
from overlay.check.models.recipes import Recipe, TrainedRecipe, TrainSpec
from overlay.check.models.tokenizer import BOS_ID, EOS_ID


def training_tokens(spec: TrainSpec) -> np.ndarray:
    """The token stream a kind trains on: ``<s> doc </s>`` for each corpus document, int32."""
    tokenizer = _shared_tokenizer()
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(documents(spec.corpus_docs, seed=0)):
        ids.extend(encoding.ids)  # the post-processor already put <s> in front
        ids.append(EOS_ID)
    stream = np.asarray(ids, dtype=np.int32)
    if stream[0] != BOS_ID:
        raise RuntimeError("tokenizer did not add <s> in front of a document")
    return stream


_TOKENIZER_CACHE: dict[str, Any] = {}


def _shared_tokenizer() -> Any:
    if "t" not in _TOKENIZER_CACHE:
        from overlay.check.models.tokenizer import train_tokenizer

        _TOKENIZER_CACHE["t"] = train_tokenizer()
    return _TOKENIZER_CACHE["t"]


def _from_mlx_llama(trained: Mapping[str, np.ndarray]) -> W.Tensors:
    """mlx-lm llama parameter names are the HF names; nothing to convert."""
    return {k: v.astype(np.float32) for k, v in trained.items()}


QWEN_SHIFTED_SUFFIXES: Final = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)
QWEN_MTP_SHIFTED: Final = ("norm.weight", "pre_fc_norm_hidden.weight", "pre_fc_norm_embedding.weight")


def _from_mlx_qwen35(trained: Mapping[str, np.ndarray]) -> W.Tensors:
    """mlx-lm ``qwen3_5.Model`` parameters -> the HF (VLM) layout with zero-centred norms and (C, 1, K) conv1d."""
    out: W.Tensors = {}
    for name, value in trained.items():
        value = value.astype(np.float32)
        if name == "language_model.lm_head.weight":
            hf = "lm_head.weight"
        elif name.startswith("language_model.model."):
            hf = W.QWEN35_PREFIX + "." + name[len("language_model.model.") :]
        else:
            raise ValueError(f"unexpected qwen3_5 parameter {name}")
        if hf.endswith("conv1d.weight"):
            value = np.ascontiguousarray(np.moveaxis(value, 2, 1))  # mlx (C, K, 1) -> HF (C, 1, K)
        if hf.endswith(QWEN_SHIFTED_SUFFIXES) or hf == f"{W.QWEN35_PREFIX}.norm.weight":
            value = (value - np.float32(1.0)).astype(np.float32)
        out[hf] = value
    return out


def _from_mlx_mtp(trained: Mapping[str, np.ndarray]) -> W.Tensors:
    """Our MLX MTP head (effective norm weights) -> ``mtp.*`` with zero-centred norms."""
    out: W.Tensors = {}
    for name, value in trained.items():
        value = value.astype(np.float32)
        if name in QWEN_MTP_SHIFTED or name.endswith(QWEN_SHIFTED_SUFFIXES):
            value = (value - np.float32(1.0)).astype(np.float32)
        out[f"mtp.{name}"] = value
    return out


def build_trained(recipe: Recipe, out: Path, ctx: BuildContext) -> dict[str, Any]:
    assert isinstance(recipe, TrainedRecipe)
    python = resolve_mlx_python(ctx.kind, ctx.python)
    versions = probe_mlx_python(python)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    config, init_tensors = config_and_tensors(recipe, W.Init(ctx.seed, 1.0))
    write_model_files(out, config, init_tensors)
    data = ctx.scratch / "tokens.npy"
    np.save(data, training_tokens(recipe.train))
    timings["prepare_s"] = round(time.perf_counter() - t0, 3)

    def train(task: str, spec: TrainSpec, into: Path, what: str, timing: str) -> dict[str, Any]:
        """One run of ``_mlx_tasks.py`` (``train_lm``, ``train_mtp``) on the model in ``out``, saving to ``into``;
        its wall and CPU seconds go into ``timings`` as ``{timing}_s`` and ``{timing}_cpu_s``."""
        payload = {
            "task": task,
            "model": str(out),
            "data": str(data),
            "spec": dataclasses.asdict(spec),
            "seed": ctx.seed,
            "out": str(into),
        }
        result = run_mlx_script(python, payload, what)
        timings[f"{timing}_s"] = result["seconds"]
        timings[f"{timing}_cpu_s"] = result["cpu_seconds"]
        return result

    ctx.reporter.step("model", f"training {ctx.kind} ({recipe.train.steps} steps) with {python}")
    trained_path = ctx.scratch / "trained.safetensors"
    result = train("train_lm", recipe.train, trained_path, f"training {ctx.kind}", "train")
    trained = load_tensors(trained_path)
    tensors = _from_mlx_llama(trained) if recipe.arch == "llama" else _from_mlx_qwen35(trained)
    missing = sorted(set(init_tensors) - set(tensors) - {n for n in init_tensors if n.startswith("mtp.")})
    if missing:
        raise RuntimeError(f"training {ctx.kind} lost tensors {missing[:5]}")
    training: dict[str, Any] = {"target": {k: result[k] for k in ("losses", "steps", "tokens_per_step")}}

    if recipe.mtp_train is not None:
        tensors.update({n: v for n, v in init_tensors.items() if n.startswith("mtp.")})  # initial head
        save_tensors(out / "model.safetensors", tensors)
        ctx.reporter.step("model", f"training the MTP head of {ctx.kind} ({recipe.mtp_train.steps} steps)")
        mtp_path = ctx.scratch / "mtp.safetensors"
        what = f"training the MTP head of {ctx.kind}"
        result = train("train_mtp", recipe.mtp_train, mtp_path, what, "train_mtp")
        timings["train_mtp_hidden_s"] = result["hidden_seconds"]
        tensors = {n: v for n, v in tensors.items() if not n.startswith("mtp.")}
        tensors.update(_from_mlx_mtp(load_tensors(mtp_path)))
        training["mtp"] = {
            k: result[k] for k in ("losses", "steps", "tokens_per_step", "heldout_top1_agreement")
        }
    save_tensors(out / "model.safetensors", tensors)
    return {
        "description": recipe.description,
        **mtp_details(recipe),
        "training": training,
        "trained_with": versions,
        "timings": timings,
    }
