"""TEST INFRASTRUCTURE (overlay SGLang CPU harness): keep ``torchvision`` from being imported.

SGLang 0.5.23 imports torchvision on its text-only paths (``configs/__init__`` -> ``nano_nemotron_vl`` ->
``multimodal/internvl_utils``). The package index only has CUDA builds of torchvision, which fail against the CPU
build of torch (``RuntimeError: operator torchvision::nms does not exist``). This module is imported at interpreter
start because its folder is on ``PYTHONPATH``; it installs the shared harnesses' meta-path finder
(support/testbackends/shared/overlay_torchvision_stub.py, also on the arm's ``PYTHONPATH``), which serves an inert,
labelled stub for ``torchvision`` and every submodule. Any attribute of the stub is another stub; calling one records
the call and raises, so a code path that really needs torchvision fails loudly instead of computing garbage.

Disable with ``OVERLAY_SGLANG_KEEP_TORCHVISION=1``. Never shipped inside a patched wheel.
"""

from __future__ import annotations

import os

if os.environ.get("OVERLAY_SGLANG_KEEP_TORCHVISION") != "1":
    import overlay_torchvision_stub

    overlay_torchvision_stub.install("overlay SGLang CPU test harness")
