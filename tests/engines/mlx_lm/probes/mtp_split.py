"""Probe: split MTP drafter folders (the published ``*_mtp`` drafter layout), built and loaded.

Payload: {"mode": "split" | "load", ...}.

- split: {"jobs": [{"src", "dst", "source": "hf" | "mlx"}]}. Writes a drafter folder ``dst`` the way the published
  Qwen drafters are laid out (mlx-vlm's ``qwen3_5_mtp`` splitter, mlx-community ``*-MTP-*`` repos): ``config.json``
  with ``model_type`` ``"<family>_mtp"`` and the source's text config, ``model.safetensors`` with only the head's
  tensors, sanitized and named without the ``mtp.`` prefix, the tokenizer files. ``source`` "hf": ``src`` is a
  Hugging Face checkpoint (``mtp.*`` tensors, zero-centred norms: shifted by +1 here, as the splitter does); "mlx":
  ``src`` is a folder converted with ``--keep-mtp`` (its ``mtp*.safetensors`` sidecar, already sanitized; a
  quantized sidecar records the source's ``quantization``). Uses mlx only: runs in either arm.
- load: {"jobs": [{"model", "config": model_config or null}], "tokens": [ids]}. Result per job (in order):
  "logits" digest, "has_mtp", "mtp_logits" (digest of ``mtp_forward`` on the prompt's hidden states), "quantized"
  (quantized modules of the head), or "error" (the exception's type and text).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
from mtp_common import digest
from probe_io import emit, log, read_payload

# Norms a Hugging Face Qwen checkpoint stores zero-centred (the splitter adds 1, as sanitize does).
NORM_SUFFIXES = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
    "norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def _family(config: dict[str, Any]) -> str:
    model_type = str(config.get("model_type", ""))
    return "qwen3_5" if model_type.startswith("qwen3_5") else model_type


def split(job: dict[str, Any]) -> dict[str, Any]:
    src, dst = Path(job["src"]), Path(job["dst"])
    config = json.loads((src / "config.json").read_text())
    text_config = dict(config.get("text_config") or config)
    head: dict[str, mx.array] = {}
    if job["source"] == "hf":
        for path in sorted(src.glob("model*.safetensors")):
            for key, value in mx.load(str(path)).items():
                if not key.startswith("mtp."):
                    continue
                key = key[len("mtp.") :]
                if value.ndim == 1 and key.endswith(NORM_SUFFIXES):
                    value = value + 1.0
                head[key] = value
    else:
        for path in sorted(src.glob("mtp*.safetensors")):
            for key, value in mx.load(str(path)).items():
                head[key.split("mtp.", 1)[1]] = value
    if not head:
        raise SystemExit(f"no MTP tensors in {src}")
    dst.mkdir(parents=True, exist_ok=True)
    mx.eval(list(head.values()))
    mx.save_safetensors(str(dst / "model.safetensors"), head, metadata={"format": "mlx"})
    drafter = {
        "model_type": f"{_family(config)}_mtp",
        "text_config": text_config,
        "block_size": 3,
        "tie_word_embeddings": bool(text_config.get("tie_word_embeddings", True)),
    }
    if any(k.endswith(".scales") for k in head) and config.get("quantization"):
        drafter["quantization"] = drafter["quantization_config"] = config["quantization"]
    (dst / "config.json").write_text(json.dumps(dict(sorted(drafter.items())), indent=2))
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    log(f"mtp_split: {src} ({job['source']}) -> {dst}: {len(head)} tensors")
    return {"tensors": sorted(head), "model_type": drafter["model_type"]}


def load(jobs: list[dict[str, Any]], tokens: list[int]) -> list[dict[str, Any]]:
    from mlx_lm.utils import load_model

    prompt = mx.array([tokens])
    out = []
    for job in jobs:
        try:
            model, _ = load_model(Path(job["model"]), model_config=job.get("config"))
        except Exception as exc:  # the probe reports what the loader raised
            out.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        entry: dict[str, Any] = {"logits": digest(model(prompt)), "has_mtp": False}
        try:
            from mlx_lm.models.mtp import has_mtp
        except ImportError:  # stock mlx-lm has no MTP module
            has_mtp = None
        if has_mtp is not None and has_mtp(model):
            _, hidden = model(prompt, return_hidden=True)
            logits, _ = model.mtp_forward(hidden[:, :-1], prompt[:, 1:])
            entry.update(
                has_mtp=True,
                mtp_logits=digest(logits),
                quantized=sum(1 for _, m in model.mtp.named_modules() if hasattr(m, "bits")),
            )
        out.append(entry)
    return out


def main() -> None:
    payload = read_payload()
    if payload["mode"] == "split":
        emit({job["dst"]: split(job) for job in payload["jobs"]})
    else:
        emit(load(payload["jobs"], payload["tokens"]))


if __name__ == "__main__":
    main()
