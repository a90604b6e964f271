"""overlay: pinned performance patch series for LLM serving engines, applied strictly, shipped as drop-in wheels."""

from __future__ import annotations

# The one place the version is written: pyproject.toml reads it (`[tool.setuptools.dynamic]`), `overlay --version`
# and overlay.json's "tool" block print it. Nothing looks the tool up by its distribution name at run time.
__version__ = "0.1.0"

# The distribution on the package index (`pip install engine-overlay`); the import name, the command and the
# "tool" name in overlay.json stay "overlay".
DISTRIBUTION = "engine-overlay"
