"""TEST INFRASTRUCTURE (overlay vLLM CPU arm): the torchvision stub, for the models whose vLLM module needs it.

vLLM 0.32.0 imports torchvision on the text path of the hybrid qwen3_5 (``models/qwen3_5.py`` -> ``qwen3_vl`` ->
transformers' ``qwen2_vl`` image and video processors, whose ``from torchvision.transforms.v2 import functional`` is
unguarded); the package index's torchvision builds need CUDA torch and do not import beside torch 2.13.0+cpu. With
``OVERLAY_VLLM_TORCHVISION_STUB=1`` (set by the check's vLLM adapter for those models only, overlay.engines.vllm) this
module, imported at interpreter start because its folder is on the arm's ``PYTHONPATH`` (overlays/vllm.toml
``[runtime] python-path``), serves the inert stub of support/testbackends/shared/overlay_torchvision_stub.py in this
process and in every interpreter vLLM starts (a spawned engine core or worker imports this module too). Without the
variable nothing is installed: the llama runs import what they imported before (transformers then finds no
torchvision and skips its image utilities). Never shipped inside a patched wheel.
"""

from __future__ import annotations

import os

if os.environ.get("OVERLAY_VLLM_TORCHVISION_STUB") == "1":
    import overlay_torchvision_stub

    overlay_torchvision_stub.install("overlay vLLM CPU test harness")
