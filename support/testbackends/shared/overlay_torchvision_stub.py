"""TEST INFRASTRUCTURE (overlay CPU harnesses): serve an inert, labelled stub for ``torchvision``.

Some engines import torchvision on their text-only paths (vLLM 0.32.0's qwen3_5 model module: ``qwen3_5`` ->
``qwen3_vl`` -> transformers' ``qwen2_vl`` image and video processors, whose ``torchvision.transforms.v2`` import is
unguarded). The package index only has CUDA builds of torchvision, which fail against the CPU build of torch
(``RuntimeError: operator torchvision::nms does not exist``). :func:`install` puts a meta-path finder first on
``sys.meta_path`` that serves a stub for ``torchvision`` and every submodule: any attribute of the stub is another
stub; calling one records the call in :data:`CALLS` and raises, so a code path that really needs torchvision (an
image or video processor, the vision tower) fails loudly instead of computing garbage, and a test can assert that
none was attempted even where the caller swallows the error.

Installed by a harness's ``sitecustomize`` (support/testbackends/vllm/site, support/testbackends/sglang/site); never shipped
inside a patched wheel. The stub's ``__version__`` is ``0.0.0+overlay.stub`` and every stub module has
``__overlay_stub__`` set to the harness that installed it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["CALLS", "VERSION", "install", "installed"]

BLOCKED = "torchvision"
VERSION = "0.0.0+overlay.stub"
CALLS: list[str] = []
"""Every stub object called in this process (dotted names), in order: each call also raised."""


class _Inert:
    """Placeholder for any torchvision object: attribute access chains, calls fail loudly (and are recorded)."""

    def __init__(self, name: str, harness: str) -> None:
        self._name = name
        self._harness = harness

    def __getattr__(self, item: str) -> _Inert:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Inert(f"{self._name}.{item}", self._harness)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        CALLS.append(self._name)
        raise RuntimeError(
            f"{self._name} was called, but torchvision is stubbed out by the {self._harness} "
            "(support/testbackends/shared/overlay_torchvision_stub.py); this code path needs a real torchvision"
        )

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __repr__(self) -> str:
        return f"<overlay torchvision stub {self._name}>"


class _StubModule(types.ModuleType):
    __overlay_stub__: str

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Inert(f"{self.__name__}.{item}", self.__overlay_stub__)


class _Loader(importlib.abc.Loader):
    def __init__(self, harness: str) -> None:
        self.harness = harness

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so every submodule resolves through the finder too
        module.__version__ = VERSION  # type: ignore[attr-defined]
        module.__overlay_stub__ = self.harness
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, harness: str) -> None:
        self.harness = harness

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == BLOCKED or fullname.startswith(BLOCKED + "."):
            return importlib.machinery.ModuleSpec(fullname, _Loader(self.harness), is_package=True)
        return None


def installed() -> str | None:
    """The harness whose stub finder is on ``sys.meta_path`` (None when none is)."""
    return next((f.harness for f in sys.meta_path if isinstance(f, _Finder)), None)


def install(harness: str) -> None:
    """Serve the stub for ``torchvision`` in this process (once; ``harness`` labels the stub and its errors). A
    torchvision already imported is left as it is: install before anything imports it (a ``sitecustomize``)."""
    if installed() is None:
        sys.meta_path.insert(0, _Finder(harness))
