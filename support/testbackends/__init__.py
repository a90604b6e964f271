"""Test backends: TEST INFRASTRUCTURE ONLY.

Small, clearly labelled stand-ins that let engines whose compiled extensions need hardware this machine lacks
(an NVIDIA GPU, AVX-512/AMX) run their Python code paths on a plain x86-64 CPU, so stock and patched wheels can be
compared end to end in CI. They are put on ``PYTHONPATH`` of a test arm only (see the ``[runtime]`` table of
``overlays/ENGINE.toml``) and are never copied into a patched wheel. Their numerics are references, not kernels:
speed measured through them means nothing.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["root"]


def root() -> Path:
    """The folder holding one sub-folder of test backends per engine."""
    return Path(__file__).resolve().parent
