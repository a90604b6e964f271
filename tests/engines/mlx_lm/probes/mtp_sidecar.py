"""Probe: ``mlx_lm.convert`` with and without kept MTP weights, and loading the converted folders.

Payload: {"mode": "convert" | "load", ...}.

- convert: {"jobs": [{"src", "dst", "keep": bool, "quantize": null | {"bits", "group_size"}}]}. Result per dst:
  "files" (name -> sha256 of every file but README.md), "sidecar" (tensor names of mtp*.safetensors),
  "config_keys" (top-level keys of config.json), "mtp_quantization" (per-layer quantization entries naming mtp).
- load: {"dirs": [dir], "tokens": [ids], "keep": bool}. Result per dir: "logits" digest, "params" (name -> digest),
  "files_read" (names passed to mx.load), and with keep: "has_mtp", "mtp_logits" (digest of ``mtp_forward`` on
  the prompt's hidden states), "unquantized" (MTP modules left as plain Linear: the fc / eh_proj projections),
  "quantized" (number of quantized MTP modules).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten
from mtp_common import digest, digests
from probe_io import emit, log, read_payload


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def convert_jobs(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    from mlx_lm.convert import convert

    result = {}
    for job in jobs:
        log(f"mtp_sidecar: convert {job['src']} -> {job['dst']} keep={job['keep']} q={job.get('quantize')}")
        kwargs: dict[str, Any] = {}
        if job["keep"]:
            kwargs["keep_mtp"] = True  # only the patched convert() has the parameter
        q = job.get("quantize")
        if q:
            kwargs.update(quantize=True, q_bits=q["bits"], q_group_size=q["group_size"])
        convert(job["src"], job["dst"], **kwargs)
        dst = Path(job["dst"])
        config = json.loads((dst / "config.json").read_text())
        sidecar: list[str] = []
        for path in sorted(dst.glob("mtp*.safetensors")):
            sidecar.extend(mx.load(str(path)))
        result[job["dst"]] = {
            "files": {p.name: _sha256(p) for p in sorted(dst.iterdir()) if p.name != "README.md"},
            "sidecar": sorted(sidecar),
            "config_keys": sorted(config),
            "mtp_quantization": sorted(k for k in config.get("quantization", {}) if "mtp" in k),
        }
    return result


def load_dirs(dirs: list[str], tokens: list[int], keep: bool) -> dict[str, Any]:
    from mlx_lm.utils import load_model

    calls: list[str] = []
    original = mx.load

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(Path(str(path)).name)
        return original(path, *args, **kwargs)

    result = {}
    prompt = mx.array([tokens])
    for d in dirs:
        calls.clear()
        mx.load = counting
        try:
            model, _ = load_model(Path(d), model_config={"keep_mtp": True} if keep else None)
        finally:
            mx.load = original
        entry: dict[str, Any] = {
            "logits": digest(model(prompt)),
            "params": digests(tree_flatten(model.parameters())),
            "files_read": sorted(calls),
        }
        if keep:
            from mlx_lm.models.mtp import has_mtp

            entry["has_mtp"] = has_mtp(model)
            if entry["has_mtp"]:
                _, hidden = model(prompt, return_hidden=True)
                logits, _ = model.mtp_forward(hidden[:, :-1], prompt[:, 1:])
                entry["mtp_logits"] = digest(logits)
                modules = dict(model.mtp.named_modules())
                entry["unquantized"] = sorted(k for k, m in modules.items() if type(m) is nn.Linear)
                entry["quantized"] = sum(1 for m in modules.values() if hasattr(m, "bits"))
        result[d] = entry
    return result


def main() -> None:
    payload = read_payload()
    if payload["mode"] == "convert":
        emit(convert_jobs(payload["jobs"]))
    else:
        emit(load_dirs(payload["dirs"], payload["tokens"], bool(payload.get("keep"))))


if __name__ == "__main__":
    main()
