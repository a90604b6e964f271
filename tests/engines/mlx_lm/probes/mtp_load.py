"""Probe: load the tiny MTP checkpoints (probes/mtp_build.py) with stock or patched mlx-lm and describe the result.

Payload: {"models": {family: model info from mtp_build}, "tokens": [ids], "keep": bool}.
``keep`` asks for the MTP weights (``model_config={"keep_mtp": True}`` and ``mtp.request_keep`` before calling
``sanitize`` directly); the stock arm cannot keep them, so tests send ``keep`` to the patched arm only.

Result per family:
- "sanitized": {name: digest} of ``model.sanitize(raw checkpoint tensors)`` (unloaded model of the same class);
- "params": {name: digest} of the parameters of the loaded model; "logits": digest of its logits on ``tokens``;
  "primitives": sorted primitive names of the logits graph of ``model(tokens)`` (``mx.export_to_dot``) and
  "primitives_inner" those of ``lm_head(inner_model(tokens))`` built from the same modules (stock's ``__call__``);
- with ``keep`` (patched arm): "mtp" = what the attached head is and does (names, shapes, caches, weight sharing,
  return_hidden, cached vs uncached passes, trim and redo).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mtp_common import build_model, digest, digests, raw_weights
from probe_io import emit, log, read_payload


def primitives(*arrays: mx.array) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.dot"
        mx.export_to_dot(str(path), *arrays)
        text = path.read_text()
    names = [
        m.group(1)
        for line in text.splitlines()
        if "shape=rectangle" in line
        for m in [re.search(r'label\s*=\s*"([^"]+)"', line)]
        if m
    ]
    return sorted(names)


def sanitized(model_dir: Path, keep: bool) -> tuple[dict[str, mx.array], dict[str, mx.array]]:
    raw = raw_weights(model_dir)
    model = build_model(model_dir)
    if keep:
        from mlx_lm.models import mtp

        mtp.request_keep(model)
    return raw, model.sanitize(dict(raw))


def describe_mtp(
    model: Any, tokens: mx.array, info: dict[str, Any], raw: dict[str, mx.array], clean: dict[str, mx.array]
) -> dict[str, Any]:
    from mlx_lm.models import mtp as mtp_lib

    out: dict[str, Any] = {"has_mtp": mtp_lib.has_mtp(model)}
    if not out["has_mtp"]:
        return out
    owner = mtp_lib.mtp_owner(model)
    prefix = mtp_lib.mtp_prefix(model)
    head = model.mtp
    names = sorted(k for k, _ in tree_flatten(head.parameters()))
    out["module"] = type(head).__name__
    out["prefix"] = prefix
    out["names"] = names
    out["kept"] = sorted(k[len(prefix) :] for k in clean if k.startswith(prefix))
    out["same_object"] = head is owner["mtp"]

    # Values: the head's own projection is the checkpoint's; Qwen zero-centred norms get +1.
    if info["style"] == "qwen":
        shifted = [
            mx.array_equal(clean[prefix + n], raw["mtp." + n] + 1.0).item()
            for n in ("norm.weight", "pre_fc_norm_hidden.weight", "pre_fc_norm_embedding.weight")
        ]
        out["norm_shift"] = all(shifted)
        out["proj_equal"] = mx.array_equal(clean[prefix + "fc.weight"], raw["mtp.fc.weight"]).item()
    else:
        first = info["first"]
        out["proj_equal"] = mx.array_equal(
            clean[prefix + "layers.0.eh_proj.weight"], raw[f"model.layers.{first}.eh_proj.weight"]
        ).item()
        out["norm_shift"] = mx.array_equal(
            clean[prefix + "layers.0.enorm.weight"], raw[f"model.layers.{first}.enorm.weight"]
        ).item()

    # return_hidden: same logits, hidden = the input of lm_head.
    logits = model(tokens)
    logits_h, hidden = model(tokens, return_hidden=True)
    inner = owner.model(tokens)
    out["return_hidden"] = {
        "logits_equal": mx.array_equal(logits, logits_h).item(),
        "hidden_equal": mx.array_equal(hidden, inner).item(),
        "hidden_shape": list(hidden.shape),
    }

    # One MTP pass over the prompt (no cache), then the same pairs one at a time with the cache.
    n = tokens.shape[1]
    h, nxt = hidden[:, : n - 1], tokens[:, 1:]
    full_logits, full_hidden = model.mtp_forward(h, nxt)
    cache = model.make_mtp_cache()
    steps = [model.mtp_forward(h[:, t : t + 1], nxt[:, t : t + 1], cache)[0] for t in range(n - 1)]
    stepwise = mx.concatenate(steps, axis=1)
    out["shapes"] = {"logits": list(full_logits.shape), "hidden": list(full_hidden.shape)}
    out["cached_vs_full_max_abs"] = mx.abs(stepwise - full_logits).max().item()
    out["cache"] = {
        "types": [type(c).__name__ for c in cache],
        "trimmable": [c.is_trimmable() for c in cache],
        "offset": [c[0].offset if hasattr(c, "caches") else c.offset for c in cache],
    }

    # Chained draft step (MTP hidden -> next step), then trim it away and redo it: identical logits.
    draft = mx.argmax(full_logits[:, -1:], axis=-1)
    chained, _ = model.mtp_forward(full_hidden[:, -1:], draft, cache, step=1)
    trimmed = [c.trim(1) for c in cache]
    again, _ = model.mtp_forward(full_hidden[:, -1:], draft, cache, step=1)
    out["chained_shape"] = list(chained.shape)
    out["trimmed"] = trimmed
    out["redo_equal"] = mx.array_equal(chained, again).item()

    # Weight sharing: the head holds no embedding / output head of its own, and uses the target's.
    out["own_embed_or_head"] = [
        k for k in names if "embed_tokens" in k or "lm_head" in k or k.endswith("head.weight")
    ]
    out["param_count"] = {
        "mtp": sum(v.size for _, v in tree_flatten(head.parameters())),
        "total": sum(v.size for _, v in tree_flatten(model.parameters())),
    }
    if "lm_head" in owner:
        owner.lm_head.weight = mx.zeros_like(owner.lm_head.weight)
    else:
        owner.model.embed_tokens.weight = mx.zeros_like(owner.model.embed_tokens.weight)
    zeroed, _ = model.mtp_forward(h, nxt)
    out["zero_head_max_abs"] = mx.abs(zeroed).max().item()
    return out


def main() -> None:
    payload = read_payload()
    from mlx_lm.utils import load_model

    tokens = mx.array([payload["tokens"]])
    keep = bool(payload.get("keep"))
    result: dict[str, Any] = {}
    for family, info in payload["models"].items():
        log(f"mtp_load: {family} keep={keep}")
        model_dir = Path(info["dir"])
        raw, clean = sanitized(model_dir, keep)
        model, _ = load_model(model_dir, model_config={"keep_mtp": True} if keep else None)
        logits = model(tokens)
        graph = primitives(logits)  # before evaluation: an evaluated array has no graph
        owner = model.get("language_model", model)
        hidden = owner.model(tokens)
        inner = owner.lm_head(hidden) if "lm_head" in owner else owner.model.embed_tokens.as_linear(hidden)
        entry: dict[str, Any] = {
            "sanitized": digests(clean.items()),
            "params": digests(tree_flatten(model.parameters())),
            "logits": digest(logits),
            "primitives": graph,
            "primitives_inner": primitives(inner),
        }
        if keep:
            entry["mtp"] = describe_mtp(model, tokens, info, raw, clean)
        result[family] = entry
    emit(result)


if __name__ == "__main__":
    main()
