"""Fixtures for the tiny-model tests: throwaway build roots, and the interpreters that load the models.

- ``mlx_python``: the stock mlx-lm arm from ``overlay.check.envs`` (pinned mlx-lm wheel installed over the mlx-lm deps
  venv), the same venv the per-patch tests use; built once and cached under build/venvs.
- ``hf_python``: the sglang deps venv from ``overlay.check.envs`` (torch 2.13.0 CPU + transformers), which is what feeds
  the llama kinds to SGLang.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from overlay.check.models import build
from overlay.check.models.mlxproc import mlx_env, stock_mlx_python
from tinymodels.tiny_support import RANDOM_KINDS, REPO, Interpreter


@pytest.fixture(scope="session")
def mlx_python() -> Interpreter:
    return Interpreter(stock_mlx_python(REPO), mlx_env())


@pytest.fixture(scope="session")
def hf_python() -> Interpreter:
    from overlay.check.envs import deps_env, runtime_env
    from overlay.core.manifest import load_engine

    manifest = load_engine(REPO, "sglang")
    venv = deps_env(REPO, manifest)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
    env.update(runtime_env(REPO, manifest))
    return Interpreter(venv / "bin" / "python", env)


@pytest.fixture(scope="session")
def random_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every random kind, built once into a throwaway root."""
    root = tmp_path_factory.mktemp("models-a")
    return {kind: build(kind, root=root) for kind in RANDOM_KINDS}
