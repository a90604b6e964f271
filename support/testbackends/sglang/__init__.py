"""SGLang CPU test backend: TEST INFRASTRUCTURE ONLY, never shipped inside a patched wheel.

SGLang 0.5.23 runs on a GPU-less x86-64 machine with ``SGLANG_USE_CPU_ENGINE=1`` once three things are in place;
this package provides them (see docs/engines/sglang.md, "CPU test harness"):

- ``site/sitecustomize.py``: keeps ``torchvision`` from being imported (the package index only has CUDA builds,
  which fail against CPU torch) by serving an inert stub from a meta-path finder. Because it is a
  ``sitecustomize`` on ``PYTHONPATH``, the scheduler and detokenizer subprocesses SGLang spawns get it too.
- ``site/sgl_kernel/``: a pure-torch stand-in for the CPU build of ``sgl_kernel`` (cache-location bookkeeping,
  greedy tree verification, tree construction, reference decode/extend attention). Reference math in plain torch:
  slow, causal-only attention, no AMX GEMMs.
- ``run_engine.py``: starts ``sglang.Engine`` offline on a model folder and prints one JSON document with the greedy
  tokens and speculative-decoding ``meta_info`` of each request (payload on stdin, see its docstring).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["RUN_ENGINE", "SITE_DIR", "cpu_env"]

SITE_DIR = Path(__file__).resolve().parent / "site"
RUN_ENGINE = Path(__file__).resolve().parent / "run_engine.py"


def cpu_env() -> dict[str, str]:
    """Environment variables an arm needs to run SGLang on the CPU (``PYTHONPATH`` excluded)."""
    return {
        "SGLANG_USE_CPU_ENGINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
