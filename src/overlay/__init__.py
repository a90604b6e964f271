"""overlay: pinned performance patch series for LLM serving engines, applied strictly, shipped as drop-in wheels."""

from __future__ import annotations

__version__ = "0.1.0"
