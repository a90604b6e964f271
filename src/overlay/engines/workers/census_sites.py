"""How a census names a call site's file, the same on the CPU (torch_census) and the GPU (cuda_census): inside
site-packages, or relative to the working folder. No torch here, so the GPU instrument's pure parts import it too."""

from __future__ import annotations

import os


def relative(path: str) -> str:
    marker = "site-packages" + os.sep
    if marker in path:
        return path.rsplit(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
