"""Labelled stand-ins for vLLM's native extension modules in the device check's arms (standard library only; runs in
the arm's Python, before vLLM is imported).

The vLLM trees the device check carries hold the CUDA wheel's Python files only (scripts/device/vllm_prepare.py): its
native modules (``vllm/_C_stable_libtorch.abi3.so``, 78.8 MB; 54.4 MB even at ``xz -9e``; the FlashAttention builds,
several hundred MB) are over the device tool's 64 MiB carry limit. vLLM imports some of them unconditionally
(``vllm/platforms/cuda.py``: ``import vllm._C_stable_libtorch`` to register its ops), so each native module the wheel
holds is answered, only when no real one is found on ``sys.path`` (the finder is the last on ``sys.meta_path``), by a
``StandIn`` module: importing it succeeds, reading any attribute raises ``NativeStandIn`` naming the module and the
attribute. It registers no op: a ``torch.ops._C.*`` call then fails in torch with its own "no such operator" error,
which the device check reports as "needs the native module" (never as a result). ``stood_in()`` lists the modules
that were answered this way, for the report.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterable, Sequence

LABEL = "device-check stand-in for a native vLLM module that cannot travel to the device"
_STOOD_IN: list[str] = []


class NativeStandIn(RuntimeError):
    """A stood-in native module was used: what needed it is not measured."""


class StandIn(types.ModuleType):
    """An empty module in place of a native extension; any attribute it is asked for raises."""

    __overlay_stand_in__ = LABEL

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise NativeStandIn(
            f"{self.__name__}.{name}: {self.__name__} is a labelled stand-in ({LABEL}); what calls it is not "
            f"measured by the device check"
        )


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: Iterable[str]) -> None:
        self.names = set(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=LABEL)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        _STOOD_IN.append(spec.name)
        return StandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def module_name(member: str) -> str | None:
    """The module a wheel member names when it is a native extension (``vllm/_C.abi3.so`` -> ``vllm._C``)."""
    if not member.endswith(".so"):
        return None
    parts = member[: -len(".so")].split("/")
    parts[-1] = parts[-1].split(".", 1)[0]
    return ".".join(parts)


def install(names: Iterable[str]) -> None:
    """Answer these module names with stand-ins when nothing else on ``sys.meta_path`` finds them."""
    finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
    if finder is None:
        sys.meta_path.append(_Finder(names))
    else:
        finder.names.update(names)


def stood_in() -> list[str]:
    return sorted(set(_STOOD_IN))
