"""TEST INFRASTRUCTURE (overlay SGLang CPU harness): keep ``torchvision`` from being imported.

SGLang 0.5.23 imports torchvision on its text-only paths (``configs/__init__`` -> ``nano_nemotron_vl`` ->
``multimodal/internvl_utils``). The package index only has CUDA builds of torchvision, which fail against the CPU
build of torch (``RuntimeError: operator torchvision::nms does not exist``). This module is imported at interpreter
start because its folder is on ``PYTHONPATH``; it installs a meta-path finder that serves an inert stub for
``torchvision`` and every submodule. Any attribute of the stub is another stub; calling one raises, so a code path
that really needs torchvision fails loudly instead of computing garbage.

Disable with ``OVERLAY_SGLANG_KEEP_TORCHVISION=1``. Never shipped inside a patched wheel.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

_BLOCKED = "torchvision"


class _Inert:
    """Placeholder for any torchvision object: attribute access chains, calls fail loudly."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, item: str) -> _Inert:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Inert(f"{self._name}.{item}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._name} was called, but torchvision is stubbed out by the overlay SGLang CPU test harness "
            "(support/testbackends/sglang/site/sitecustomize.py); this code path needs a real torchvision"
        )

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __repr__(self) -> str:
        return f"<overlay torchvision stub {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Inert(f"{self.__name__}.{item}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so every submodule resolves through the finder too
        module.__version__ = "0.0.0+overlay.stub"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == _BLOCKED or fullname.startswith(_BLOCKED + "."):
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


if os.environ.get("OVERLAY_SGLANG_KEEP_TORCHVISION") != "1":
    sys.meta_path.insert(0, _Finder())
