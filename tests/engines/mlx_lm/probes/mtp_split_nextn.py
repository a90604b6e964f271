"""Probe: split nextn MTP drafter folders, laid out as the published ones (mlx only: runs in either arm).

Payload: {"jobs": [{"src": a Hugging Face checkpoint with a nextn layer ``model.layers.{N}.*`` (probes/mtp_build.py),
"dst", "layout": "model" | "mtp", "quantize": null | {"bits", "group_size"}}]}. Result: {dst: {"tensors",
"model_type"}}.

The two layouts mlx-vlm's splitters write (``mlx_vlm/speculative/drafters/glm4_moe_lite_mtp/split.py`` and
``glm_moe_dsa_mtp/split.py``), written here from their description, not their code: ``config.json`` with
``model_type`` ``"<family>_mtp"`` and the source's config as ``text_config``; ``model.safetensors`` with the nextn
layer only, sanitized (the experts stacked into ``switch_mlp``, ``kv_b_proj`` split into ``embed_q`` /
``unembed_out``) and named flat:

- ``model`` (glm4_moe_lite_mtp, GLM-4.7-Flash): ``model.{enorm,hnorm,eh_proj}``, ``model.shared_head_norm``,
  ``model.mtp_block.*`` (the decoder block), and the copies ``model.embed_tokens`` and ``lm_head`` (the shared
  head's output projection);
- ``mtp`` (glm_moe_dsa_mtp, GLM-5): every tensor of the layer under ``mtp.``, ``shared_head.norm`` as
  ``shared_head_norm``, the copies kept (``mtp.embed_tokens``, ``mtp.shared_head.head``).

``quantize``: affine quantization of every weight of two or more dimensions whose last one the group divides, but the
router gate, as the splitters' ``--q-bits`` does. Unlike the published splitters (bfloat16), dtypes are kept, so a
loaded head can be compared bit for bit with the checkpoint's own nextn layer.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
from probe_io import emit, log, read_payload

EXPERT = re.compile(r"(.*)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _sanitize(tensors: dict[str, mx.array], config: dict[str, Any], attn: str) -> None:
    """In place: ``kv_b_proj`` under ``attn`` split, the routed experts stacked."""
    if f"{attn}.kv_b_proj.weight" in tensors:
        heads, nope = int(config["num_attention_heads"]), int(config["qk_nope_head_dim"])
        w = tensors.pop(f"{attn}.kv_b_proj.weight")
        w = w.reshape(heads, nope + int(config["v_head_dim"]), -1)
        tensors[f"{attn}.embed_q.weight"] = mx.contiguous(w[:, :nope, :].swapaxes(-1, -2))
        tensors[f"{attn}.unembed_out.weight"] = mx.contiguous(w[:, nope:, :])
    groups: dict[tuple[str, str], dict[int, mx.array]] = {}
    for key in list(tensors):
        m = EXPERT.match(key)
        if m:
            groups.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = tensors.pop(key)
    for (mlp, proj), experts in groups.items():
        tensors[f"{mlp}.switch_mlp.{proj}.weight"] = mx.stack([experts[e] for e in sorted(experts)])


def _quantize(tensors: dict[str, mx.array], bits: int, group_size: int) -> None:
    for key in list(tensors):
        w = tensors[key]
        if not key.endswith(".weight") or key.endswith("mlp.gate.weight"):
            continue
        if w.ndim < 2 or w.shape[-1] % group_size:
            continue
        q, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
        stem = key[: -len(".weight")]
        tensors[key], tensors[f"{stem}.scales"], tensors[f"{stem}.biases"] = q, scales, biases


def split(job: dict[str, Any]) -> dict[str, Any]:
    src, dst = Path(job["src"]), Path(job["dst"])
    config = json.loads((src / "config.json").read_text())
    first = int(config["num_hidden_layers"])
    prefix = f"model.layers.{first}."
    layer: dict[str, mx.array] = {}
    for path in sorted(src.glob("model*.safetensors")):
        for key, value in mx.load(str(path)).items():
            if key.startswith(prefix):
                layer[key[len(prefix) :]] = value
    if not layer:
        raise SystemExit(f"no {prefix}* tensors in {src}")
    head: dict[str, mx.array] = {}
    if job["layout"] == "model":
        for rest, value in layer.items():
            if rest == "embed_tokens.weight":
                head["model.embed_tokens.weight"] = value
            elif rest == "shared_head.head.weight":
                head["lm_head.weight"] = value
            elif rest == "shared_head.norm.weight":
                head["model.shared_head_norm.weight"] = value
            elif rest.split(".", 1)[0] in ("enorm", "hnorm", "eh_proj"):
                head[f"model.{rest}"] = value
            else:
                head[f"model.mtp_block.{rest}"] = value
        _sanitize(head, config, "model.mtp_block.self_attn")
    else:
        flat = {
            ("shared_head_norm.weight" if k == "shared_head.norm.weight" else k): v for k, v in layer.items()
        }
        _sanitize(flat, config, "self_attn")
        head = {f"mtp.{k}": v for k, v in flat.items()}
    quantization = None
    if job.get("quantize"):
        q = job["quantize"]
        _quantize(head, int(q["bits"]), int(q["group_size"]))
        quantization = {"group_size": int(q["group_size"]), "bits": int(q["bits"]), "mode": "affine"}
    dst.mkdir(parents=True, exist_ok=True)
    mx.eval(list(head.values()))
    mx.save_safetensors(str(dst / "model.safetensors"), head, metadata={"format": "mlx"})
    drafter: dict[str, Any] = {
        "model_type": f"{config['model_type']}_mtp",
        "text_config": config,
        "block_size": int(config.get("num_nextn_predict_layers", 1)) + 1,
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    if quantization:
        drafter["quantization"] = drafter["quantization_config"] = quantization
    (dst / "config.json").write_text(json.dumps(dict(sorted(drafter.items())), indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    log(f"mtp_split_nextn: {src} ({job['layout']}) -> {dst}: {len(head)} tensors")
    return {"tensors": sorted(head), "model_type": drafter["model_type"]}


if __name__ == "__main__":
    emit({job["dst"]: split(job) for job in read_payload()["jobs"]})
