"""Build a tiny model directory: cached by recipe hash, built in a scratch directory, published with ``os.replace``.

Layout: ``ROOT/build/models/<kind>-<hash12>/`` holding ``config.json``, ``generation_config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` and ``tinymodel.json`` (what was built: recipe,
hash inputs, file hashes, training losses; deterministic), plus ``timings.json`` (seconds; not deterministic).
Scratch directories live in ``ROOT/build/models/.tmp/`` and are removed on failure (or by the next build if the
process was killed), so an interrupted build never leaves half a model where :func:`build` looks.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from overlay.check.models import weights as W
from overlay.check.models.corpus import CORPUS_VERSION, documents
from overlay.check.models.recipes import (
    KINDS,
    DeepseekV3Shape,
    HeavyRecipe,
    LlamaShape,
    Qwen35Shape,
    RandomRecipe,
    Recipe,
    TrainedRecipe,
    TrainSpec,
)
from overlay.check.models.tokenizer import BOS_ID, EOS_ID, TOKENIZER_VERSION, write_tokenizer
from overlay.errors import ExternalCommandError, UsageError
from overlay.fsutil import file_lock, owned_scratch, sha256_file
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter

GENERATOR_VERSION: Final = 1
MANIFEST: Final = "tinymodel.json"
TIMINGS: Final = "timings.json"
OPENBLAS: Final = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
MLX_TASKS: Final = Path(__file__).with_name("_mlx_tasks.py")
TRAIN_TIMEOUT_S: Final = 3600

MLX_HINT: Final = (
    "pass python=PATH (CLI: --python PATH) naming an interpreter with mlx and mlx-lm, e.g. a venv made with "
    "`pip install 'mlx[cpu]==0.32.4' mlx-lm==0.32.2 numpy safetensors tokenizers`, or use the stock mlx-lm arm that "
    "overlay.check.envs builds (CLI: --python stock; Python: overlay.check.models.stock_mlx_python(root))"
)


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


@dataclass(frozen=True)
class BuildContext:
    kind: str
    root: Path
    seed: int
    scratch: Path
    python: Path | None
    reporter: Reporter


Builder = Callable[[Recipe, Path, BuildContext], dict[str, Any]]


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
            _write_json(out / TIMINGS, timings)
            _write_manifest(out, kind, seed, details)
            os.replace(out, final)
        reporter.step("model", f"built {kind} in {timings['total_s']:.1f} s: {final}")
    return final


# ----------------------------------------------------------------------------------------------- shared pieces


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_tensors(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    """Write fp32 tensors as safetensors (sorted names, ``{"format": "pt"}``): byte-identical for equal inputs."""
    from safetensors.numpy import save_file

    ordered = {name: np.ascontiguousarray(tensors[name]) for name in sorted(tensors)}
    for name, value in ordered.items():
        if value.dtype != np.float32:
            raise ValueError(f"tensor {name} has dtype {value.dtype}; tiny models are float32 only")
    save_file(ordered, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def load_tensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return dict(load_file(str(path)))


def _write_model_files(out: Path, config: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", W.generation_config())
    save_tensors(out / "model.safetensors", tensors)
    write_tokenizer(out)


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
    _write_json(out / MANIFEST, manifest)


def _is_mtp_tensor(name: str, layer_prefix: str | None) -> bool:
    return name.startswith("mtp.") or (layer_prefix is not None and name.startswith(layer_prefix))


def read_manifest(path: Path) -> dict[str, Any]:
    """The ``tinymodel.json`` of a built model directory."""
    data: dict[str, Any] = json.loads((path / MANIFEST).read_text())
    return data


def _config_and_tensors(
    recipe: RandomRecipe | TrainedRecipe, init: W.Init
) -> tuple[dict[str, Any], W.Tensors]:
    shape = recipe.shape
    if isinstance(shape, LlamaShape):
        return W.llama_config(shape), W.llama_weights(shape, init)
    if isinstance(shape, Qwen35Shape):
        return W.qwen35_config(shape), W.qwen35_weights(shape, init)
    if isinstance(shape, DeepseekV3Shape):
        return W.deepseek_v3_config(shape), W.deepseek_v3_weights(shape, init)
    raise TypeError(f"no weights for shape {type(shape).__name__}")


def _mtp_details(recipe: RandomRecipe | TrainedRecipe) -> dict[str, Any]:
    shape = recipe.shape
    if isinstance(shape, Qwen35Shape):
        return {"mtp": {"style": "qwen3_next", "num_layers": shape.mtp_num_hidden_layers}}
    if isinstance(shape, DeepseekV3Shape):
        return {
            "mtp": {"style": "deepseek_v3", "num_layers": shape.num_nextn_predict_layers},
            "mtp_layer_prefix": f"model.layers.{shape.num_hidden_layers}.",
        }
    return {}


# ----------------------------------------------------------------------------------------------- random kinds


def _build_random(recipe: Recipe, out: Path, ctx: BuildContext) -> dict[str, Any]:
    assert isinstance(recipe, RandomRecipe)
    t0 = time.perf_counter()
    config, tensors = _config_and_tensors(recipe, W.Init(ctx.seed, recipe.init_scale))
    _write_model_files(out, config, tensors)
    return {
        "description": recipe.description,
        **_mtp_details(recipe),
        "timings": {"weights_s": round(time.perf_counter() - t0, 3)},
    }


# ----------------------------------------------------------------------------------------------- trained kinds


def mlx_tmpdir() -> Path:
    """TMPDIR of mlx subprocesses (``$OVERLAY_MLX_TMPDIR``, default ``<system temp>/overlay-mlx-<uid>``).

    mlx keeps its JIT-compiled CPU kernels in ``$TMPDIR/mlx/<version>/``; a private folder survives other processes
    that clean ``/tmp/mlx`` while we compile (seen: ``ld: cannot open output file /tmp/mlx/...``), and is shared by
    every build root so the one-time compile (~15-25 s per training graph) is paid once per machine.
    """
    configured = os.environ.get("OVERLAY_MLX_TMPDIR")
    path = Path(configured) if configured else Path(tempfile.gettempdir()) / f"overlay-mlx-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def mlx_env() -> dict[str, str]:
    """Environment of mlx subprocesses: Debian OpenBLAS preloaded when present (fp32 GEMM ~20x faster than mlx's
    bundled reference BLAS), offline Hugging Face, and a private TMPDIR (:func:`mlx_tmpdir`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONNOUSERSITE": "1",
            "TMPDIR": str(mlx_tmpdir()),
        }
    )
    if OPENBLAS.exists() and str(OPENBLAS) not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = " ".join(p for p in (str(OPENBLAS), env.get("LD_PRELOAD", "")) if p)
    return env


_PROBED: dict[str, dict[str, str]] = {}


def probe_mlx_python(python: Path) -> dict[str, str]:
    """Versions of mlx and mlx_lm in ``python``; UsageError (with how to get one) if it cannot import them."""
    if str(python) in _PROBED:
        return _PROBED[str(python)]
    code = (
        "import json, importlib.metadata as m, mlx.core, mlx_lm; "
        "print(json.dumps({'mlx': m.version('mlx'), 'mlx_lm': m.version('mlx-lm')}))"
    )
    try:
        proc = subprocess.run(
            [str(python), "-c", code], check=False, capture_output=True, text=True, env=mlx_env(), timeout=300
        )
    except OSError as exc:
        raise UsageError(f"cannot run the interpreter {python}: {exc}", tip=MLX_HINT) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise UsageError(f"the interpreter {python} cannot import mlx and mlx_lm ({last})", tip=MLX_HINT)
    versions: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    _PROBED[str(python)] = versions
    return versions


def resolve_mlx_python(kind: str, python: Path | None) -> Path:
    """The interpreter that trains ``kind``: ``python`` if given, else this one if it has mlx, else an error."""
    if python is not None:
        return Path(python)
    if importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None:
        return Path(sys.executable)
    raise UsageError(
        f"building {kind!r} trains a model with mlx, and this interpreter ({sys.executable}) cannot import "
        "mlx and mlx_lm",
        tip=MLX_HINT,
    )


def stock_mlx_python(root: Path, reporter: Reporter | None = None) -> Path:
    """The interpreter of the stock mlx-lm arm (pinned mlx-lm wheel over the mlx-lm deps venv), built on demand."""
    from overlay.check.envs import arm_env
    from overlay.core.fetch import fetch_artifact
    from overlay.core.manifest import load_engine

    manifest = load_engine(root, "mlx-lm")
    wheel = fetch_artifact(root, manifest, manifest.upstream.primary, reporter=reporter)
    return arm_env(root, manifest, wheel, name="stock", reporter=reporter).python


def run_mlx_script(python: Path, payload: dict[str, Any], what: str) -> dict[str, Any]:
    """Run ``_mlx_tasks.py`` in ``python`` with ``payload``; the JSON result, or ExternalCommandError."""
    proc = subprocess.run(
        [str(python), str(MLX_TASKS)],
        check=False,
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=mlx_env(),
        timeout=TRAIN_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise ExternalCommandError(
            f"{what} failed in {python} (exit {proc.returncode}):\n{proc.stderr.strip()[-4000:]}",
            tip="rerun with the same interpreter to see the full log; the scratch model directory was removed",
        )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise ExternalCommandError(f"{what} printed no JSON result: {proc.stdout[-1000:]!r}") from None
    return result


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


def _spec_payload(spec: TrainSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


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


def _build_trained(recipe: Recipe, out: Path, ctx: BuildContext) -> dict[str, Any]:
    assert isinstance(recipe, TrainedRecipe)
    python = resolve_mlx_python(ctx.kind, ctx.python)
    versions = probe_mlx_python(python)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    config, init_tensors = _config_and_tensors(recipe, W.Init(ctx.seed, 1.0))
    _write_model_files(out, config, init_tensors)
    data = ctx.scratch / "tokens.npy"
    np.save(data, training_tokens(recipe.train))
    timings["prepare_s"] = round(time.perf_counter() - t0, 3)

    ctx.reporter.step("model", f"training {ctx.kind} ({recipe.train.steps} steps) with {python}")
    trained_path = ctx.scratch / "trained.safetensors"
    result = run_mlx_script(
        python,
        {
            "task": "train_lm",
            "model": str(out),
            "data": str(data),
            "spec": _spec_payload(recipe.train),
            "seed": ctx.seed,
            "out": str(trained_path),
        },
        f"training {ctx.kind}",
    )
    timings["train_s"] = result["seconds"]
    timings["train_cpu_s"] = result["cpu_seconds"]
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
        result = run_mlx_script(
            python,
            {
                "task": "train_mtp",
                "model": str(out),
                "data": str(data),
                "spec": _spec_payload(recipe.mtp_train),
                "seed": ctx.seed,
                "out": str(mtp_path),
            },
            f"training the MTP head of {ctx.kind}",
        )
        timings["train_mtp_s"] = result["seconds"]
        timings["train_mtp_cpu_s"] = result["cpu_seconds"]
        timings["train_mtp_hidden_s"] = result["hidden_seconds"]
        tensors = {n: v for n, v in tensors.items() if not n.startswith("mtp.")}
        tensors.update(_from_mlx_mtp(load_tensors(mtp_path)))
        training["mtp"] = {
            k: result[k] for k in ("losses", "steps", "tokens_per_step", "heldout_top1_agreement")
        }
    save_tensors(out / "model.safetensors", tensors)
    return {
        "description": recipe.description,
        **_mtp_details(recipe),
        "training": training,
        "trained_with": versions,
        "timings": timings,
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
    _write_model_files(out, config, tensors)
    return {
        "description": recipe.description,
        "base": {"kind": recipe.base, "dir": base_dir.name},
        **_mtp_details(base_recipe),
        "timings": {"derive_s": round(time.perf_counter() - t0, 3)},
    }


_BUILDERS: Final[Mapping[type, Builder]] = {
    RandomRecipe: _build_random,
    TrainedRecipe: _build_trained,
    HeavyRecipe: _build_heavy,
}
