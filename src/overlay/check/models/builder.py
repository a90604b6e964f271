"""Build a tiny model directory: cached by recipe hash, built in a scratch directory, published with ``os.replace``.

Layout: ``ROOT/build/models/<kind>-<hash12>/`` holding ``config.json``, ``generation_config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` and ``tinymodel.json`` (what was built: recipe,
hash inputs, file hashes, training losses; deterministic), plus ``timings.json`` (seconds; not deterministic).
Scratch directories live in ``ROOT/build/models/.tmp/`` and are removed on failure (or by the next build if the
process was killed), so an interrupted build never leaves half a model where :func:`build` looks.

Random, NextN (weights in :mod:`.nextn`) and heavy kinds are made here; trained kinds in :mod:`.training` (mlx in
another interpreter, :mod:`.mlxproc`).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from overlay.check.models import nextn
from overlay.check.models import weights as W
from overlay.check.models.common import (
    BuildContext,
    Builder,
    config_and_tensors,
    load_tensors,
    mtp_details,
    write_json,
    write_model_files,
)
from overlay.check.models.corpus import CORPUS_VERSION
from overlay.check.models.recipes import (
    KINDS,
    HeavyRecipe,
    LlamaShape,
    NextnRecipe,
    Qwen35Shape,
    RandomRecipe,
    Recipe,
    TrainedRecipe,
)
from overlay.check.models.tokenizer import TOKENIZER_VERSION
from overlay.check.models.training import build_trained
from overlay.errors import UsageError
from overlay.fsutil import file_lock, owned_scratch, sha256_file
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter

GENERATOR_VERSION: Final = 1
MANIFEST: Final = "tinymodel.json"
TIMINGS: Final = "timings.json"


def models_dir(root: Path) -> Path:
    return layout(root).models


def get_recipe(kind: str) -> Recipe:
    """The recipe of ``kind``; an unknown kind raises UsageError naming the closest kind."""
    try:
        return KINDS[kind]
    except KeyError:
        close = difflib.get_close_matches(kind, list(KINDS), n=1, cutoff=0.0)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(
            f"unknown tiny model kind {kind!r}{hint}",
            tip=f"known kinds: {', '.join(KINDS)} (`overlay models list`)",
        ) from None


def recipe_inputs(kind: str, seed: int = 0) -> dict[str, Any]:
    """Everything that decides the bytes of ``kind``: hashed into the directory name and stored in the manifest."""
    recipe = get_recipe(kind)
    fields = dataclasses.asdict(recipe)
    fields.pop("description")  # prose, not an input
    inputs: dict[str, Any] = {
        "generator": GENERATOR_VERSION,
        "corpus": CORPUS_VERSION,
        "tokenizer": TOKENIZER_VERSION,
        "kind": kind,
        "recipe_type": type(recipe).__name__,
        "recipe": fields,
        "seed": seed,
    }
    if isinstance(recipe, HeavyRecipe):
        inputs["base_hash"] = recipe_hash(recipe.base, seed)
    return inputs


def recipe_hash(kind: str, seed: int = 0) -> str:
    blob = json.dumps(recipe_inputs(kind, seed), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def model_dir(kind: str, *, root: Path, seed: int = 0) -> Path:
    """Where ``build`` puts ``kind`` (whether or not it is built yet)."""
    return models_dir(root) / f"{kind}-{recipe_hash(kind, seed)[:12]}"


def is_built(kind: str, *, root: Path, seed: int = 0) -> bool:
    return (model_dir(kind, root=root, seed=seed) / MANIFEST).is_file()


def build(
    kind: str, *, root: Path, seed: int = 0, python: Path | None = None, reporter: Reporter | None = None
) -> Path:
    """Build (or find in the cache) the model directory of ``kind`` and return its path.

    ``python``: the interpreter that runs mlx training for trained kinds (default: this one, if it imports mlx and
    mlx_lm). Random kinds never need it.
    """
    recipe = get_recipe(kind)
    if seed < 0:
        raise UsageError(f"seed must be >= 0, got {seed}")
    reporter = reporter or NullReporter()
    root = Path(root).resolve()
    final = model_dir(kind, root=root, seed=seed)
    if (final / MANIFEST).is_file():
        return final
    with file_lock(models_dir(root) / ".locks" / f"{final.name}.lock"):
        if (final / MANIFEST).is_file():
            return final
        if final.exists():  # not published by us (no manifest): never trust it
            shutil.rmtree(final)
        started = time.perf_counter()
        with owned_scratch(models_dir(root) / ".tmp", final.name) as scratch:
            out = scratch / "model"
            out.mkdir()
            ctx = BuildContext(
                kind=kind, root=root, seed=seed, scratch=scratch, python=python, reporter=reporter
            )
            reporter.step("model", f"building {kind} -> {final.name}")
            details = _BUILDERS[type(recipe)](recipe, out, ctx)
            timings = details.pop("timings", {})
            timings["total_s"] = round(time.perf_counter() - started, 3)
            write_json(out / TIMINGS, timings)
            _write_manifest(out, kind, seed, details)
            os.replace(out, final)
        reporter.step("model", f"built {kind} in {timings['total_s']:.1f} s: {final}")
    return final


def _write_manifest(out: Path, kind: str, seed: int, details: dict[str, Any]) -> None:
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in (MANIFEST, TIMINGS))
    tensors = load_tensors(out / "model.safetensors")
    manifest = {
        "version": 1,
        "kind": kind,
        "recipe_hash": recipe_hash(kind, seed),
        "inputs": recipe_inputs(kind, seed),
        "files": {name: sha256_file(out / name) for name in files},
        "tensors": len(tensors),
        "parameters": int(sum(t.size for t in tensors.values())),
        "mtp_tensors": sorted(n for n in tensors if _is_mtp_tensor(n, details.get("mtp_layer_prefix"))),
        **details,
    }
    write_json(out / MANIFEST, manifest)


def _is_mtp_tensor(name: str, layer_prefix: str | None) -> bool:
    return name.startswith("mtp.") or (layer_prefix is not None and name.startswith(layer_prefix))


def read_manifest(path: Path) -> dict[str, Any]:
    """The ``tinymodel.json`` of a built model directory."""
    data: dict[str, Any] = json.loads((path / MANIFEST).read_text())
    return data


# ----------------------------------------------------------------------------------------------- random kinds


def _build_random(recipe: Recipe, out: Path, ctx: BuildContext) -> dict[str, Any]:
    assert isinstance(recipe, RandomRecipe)
    t0 = time.perf_counter()
    config, tensors = config_and_tensors(recipe, W.Init(ctx.seed, recipe.init_scale))
    write_model_files(out, config, tensors)
    return {
        "description": recipe.description,
        **mtp_details(recipe),
        "timings": {"weights_s": round(time.perf_counter() - t0, 3)},
    }


def _build_nextn(recipe: Recipe, out: Path, ctx: BuildContext) -> dict[str, Any]:
    assert isinstance(recipe, NextnRecipe)
    t0 = time.perf_counter()
    config, tensors = nextn.config_and_tensors(recipe, ctx.seed)
    write_model_files(out, config, tensors)
    return {
        "description": recipe.description,
        **mtp_details(recipe),
        "timings": {"weights_s": round(time.perf_counter() - t0, 3)},
    }


# ----------------------------------------------------------------------------------------------- heavy kinds


def _pad_rows(w: np.ndarray, rows: int) -> np.ndarray:
    return np.concatenate([w, np.zeros((rows - w.shape[0], *w.shape[1:]), dtype=w.dtype)], axis=0)


def _pad_cols(w: np.ndarray, cols: int) -> np.ndarray:
    return np.concatenate([w, np.zeros((w.shape[0], cols - w.shape[1]), dtype=w.dtype)], axis=1)


def _widen_mlps(tensors: W.Tensors, intermediate: int) -> None:
    for name in list(tensors):
        if name.endswith((".mlp.gate_proj.weight", ".mlp.up_proj.weight")):
            tensors[name] = _pad_rows(tensors[name], intermediate)
        elif name.endswith(".mlp.down_proj.weight"):
            tensors[name] = _pad_cols(tensors[name], intermediate)


_DEAD_OUTPUTS: Final = (".o_proj.weight", ".out_proj.weight", ".down_proj.weight")


def _kill(tensors: W.Tensors) -> W.Tensors:
    return {n: (np.zeros_like(v) if n.endswith(_DEAD_OUTPUTS) else v) for n, v in tensors.items()}


def _build_heavy(recipe: Recipe, out: Path, ctx: BuildContext) -> dict[str, Any]:
    assert isinstance(recipe, HeavyRecipe)
    try:
        base_dir = build(recipe.base, root=ctx.root, seed=ctx.seed, python=ctx.python, reporter=ctx.reporter)
    except UsageError as exc:
        raise UsageError(f"{ctx.kind} derives from {recipe.base}: {exc.message}", tip=exc.tip) from None
    base_recipe = get_recipe(recipe.base)
    assert isinstance(base_recipe, (RandomRecipe, TrainedRecipe))
    t0 = time.perf_counter()
    config = json.loads((base_dir / "config.json").read_text())
    tensors = load_tensors(base_dir / "model.safetensors")
    init = W.Init(ctx.seed + 1000 * recipe.dead_seed, 1.0)
    shape = base_recipe.shape
    intermediate = recipe.intermediate_size or shape.intermediate_size
    if intermediate < shape.intermediate_size:
        raise UsageError(
            f"{ctx.kind}: intermediate_size {intermediate} < {shape.intermediate_size} of {recipe.base}"
        )
    if intermediate != shape.intermediate_size:
        _widen_mlps(tensors, intermediate)  # main layers (and a qwen MTP layer: it shares intermediate_size)
    n = shape.num_hidden_layers
    if isinstance(shape, LlamaShape):
        wide = dataclasses.replace(shape, intermediate_size=intermediate)
        for i in range(n, n + recipe.extra_layers):
            tensors.update(
                _kill(W.llama_layer(init, f"model.layers.{i}", wide, n_layers=n + recipe.extra_layers))
            )
        config["num_hidden_layers"] = n + recipe.extra_layers
        config["intermediate_size"] = intermediate
    elif isinstance(shape, Qwen35Shape):
        if recipe.extra_layers % shape.full_attention_interval:
            raise UsageError(
                f"{ctx.kind}: extra_layers must be a multiple of {shape.full_attention_interval}"
            )
        wide_q = dataclasses.replace(
            shape, intermediate_size=intermediate, num_hidden_layers=n + recipe.extra_layers
        )
        for i, layer_type in enumerate(W.qwen35_layer_types(wide_q)[n:], start=n):
            tensors.update(
                _kill(
                    W.qwen35_layer(
                        init,
                        f"{W.QWEN35_PREFIX}.layers.{i}",
                        wide_q,
                        linear=layer_type == "linear_attention",
                        n_layers=wide_q.num_hidden_layers,
                    )
                )
            )
        text = config["text_config"]
        text["num_hidden_layers"] = wide_q.num_hidden_layers
        text["intermediate_size"] = intermediate
        text["layer_types"] = W.qwen35_layer_types(wide_q)
    else:
        raise UsageError(
            f"{ctx.kind}: heavy variants exist for llama and qwen3_5, not {type(shape).__name__}"
        )
    write_model_files(out, config, tensors)
    return {
        "description": recipe.description,
        "base": {"kind": recipe.base, "dir": base_dir.name},
        **mtp_details(base_recipe),
        "timings": {"derive_s": round(time.perf_counter() - t0, 3)},
    }


_BUILDERS: Final[Mapping[type, Builder]] = {
    RandomRecipe: _build_random,
    TrainedRecipe: build_trained,
    HeavyRecipe: _build_heavy,
    NextnRecipe: _build_nextn,
}
