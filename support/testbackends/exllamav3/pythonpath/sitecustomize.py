"""TEST INFRASTRUCTURE: installs the CPU stand-in for exllamav3_ext (see overlay_exl3_standin).

This directory goes first on PYTHONPATH of the exllamav3 test arms only (overlays/exllamav3.toml
``[runtime] python-path``). Set OVERLAY_EXL3_STANDIN=0 to switch the stand-in off.
"""

from __future__ import annotations

import os

if os.environ.get("OVERLAY_EXL3_STANDIN", "1") != "0":
    import overlay_exl3_standin

    overlay_exl3_standin.install()
