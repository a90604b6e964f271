"""TEST INFRASTRUCTURE: a CPU stand-in for ExLlamaV3's compiled CUDA extension module ``exllamav3_ext``.

ExLlamaV3 ships its CUDA extension as sources and JIT-builds it on first import (``exllamav3/ext.py``); on CPU
torch that build cannot run, so ``import exllamav3`` fails. This module lets the package import on CPU so tests
can run its pure-Python/torch logic (cache and ring bookkeeping, generator control flow, config plumbing).

How it stands in: a meta-path finder answers for the top-level name ``exllamav3_ext`` with a spec whose origin
ends in an extension suffix, so the unmodified ``exllamav3/ext.py`` takes its own "precompiled extension" branch
(``import exllamav3_ext``) and gets this stand-in. Names are read from the pybind11 bindings that the installed
``exllamav3`` package ships (``exllamav3_ext/**/*.{cpp,h,cuh,cu}``): every ``m.def`` becomes a function, every
``py::class_`` a class, every ``m.attr`` a constant, so ``hasattr(ext, name)`` answers as the real module does.
Calling a function records the call in ``calls`` and then runs a CPU reference registered in ``REFERENCES``
(none by default; a test may register one) or raises ``StandInError`` naming the kernel.

The finder stays out of the way when the real thing can run: it does nothing when ``OVERLAY_EXL3_STANDIN=0``,
when torch sees a CUDA device, or when a compiled ``exllamav3_ext`` exists elsewhere on ``sys.path``.
Never ship this: it belongs to the overlay test suite only.
"""

from __future__ import annotations

import ast
import collections
import importlib.abc
import importlib.machinery
import importlib.util
import operator
import os
import re
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MODULE_NAME = "exllamav3_ext"
ORIGIN_SUFFIX = ".overlay-standin" + importlib.machinery.EXTENSION_SUFFIXES[-1]
ENV_SWITCH = "OVERLAY_EXL3_STANDIN"

_DEF_RE = re.compile(r'\bm\.def\(\s*"(\w+)"')
_CLASS_RE = re.compile(r'py::class_<[^;]*?>\s*\(\s*m\s*,\s*"(\w+)"', re.DOTALL)
_ATTR_RE = re.compile(r'\bm\.attr\(\s*"(\w+)"\s*\)\s*=\s*([^;]+);')
_DEFINE_RE = re.compile(r"^\s*#\s*define\s+(\w+)\s+(.+?)\s*$", re.MULTILINE)
_BOOL_LOCALS = {"true": True, "false": False, "cuda_only": True}

calls: collections.Counter[str] = collections.Counter()
REFERENCES: dict[str, Callable[..., Any]] = {}


class StandInError(RuntimeError):
    """A CUDA kernel of the extension was called on the CPU stand-in."""


def _eval_c_expr(expr: str, defines: dict[str, str], depth: int = 0) -> int | bool | None:
    """Evaluate an integer/boolean C constant expression made of literals, macros and + - * / ( )."""
    expr = expr.strip()
    if expr in _BOOL_LOCALS:
        return _BOOL_LOCALS[expr]
    if depth > 8:
        return None
    ops: dict[type, Callable[[Any, Any], Any]] = {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv,
    }

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return int(ops[type(node.op)](walk(node.left), walk(node.right)))
        if isinstance(node, ast.Name) and node.id in defines:
            value = _eval_c_expr(defines[node.id], defines, depth + 1)
            if value is None:
                raise ValueError(node.id)
            return int(value)
        raise ValueError(ast.dump(node))

    try:
        return walk(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError):
        return None


def read_bindings(sources_dir: Path) -> tuple[set[str], set[str], dict[str, Any]]:
    """Function names, class names and constant attributes bound by the extension sources in sources_dir."""
    functions: set[str] = set()
    classes: set[str] = set()
    raw_attrs: dict[str, str] = {}
    defines: dict[str, str] = {}
    for path in sorted(sources_dir.rglob("*")):
        if path.suffix not in (".cpp", ".h", ".cuh", ".cu") or "rocm" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        functions.update(_DEF_RE.findall(text))
        classes.update(_CLASS_RE.findall(text))
        raw_attrs.update(_ATTR_RE.findall(text))
        defines.update(_DEFINE_RE.findall(text))
    attrs = {name: _eval_c_expr(expr, defines) for name, expr in raw_attrs.items()}
    return functions, classes, attrs


def _make_function(name: str) -> Callable[..., Any]:
    def standin(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        reference = REFERENCES.get(name)
        if reference is None:
            raise StandInError(
                f"exllamav3_ext.{name} is a CUDA kernel and the CPU stand-in (overlay test infrastructure) has no "
                f"reference for it; run this path on a GPU (scripts/device/exllamav3_check.sh) or register a CPU "
                f"reference in overlay_exl3_standin.REFERENCES[{name!r}]"
            )
        return reference(*args, **kwargs)

    standin.__name__ = standin.__qualname__ = name
    standin.__doc__ = f"CPU stand-in for exllamav3_ext.{name} (test infrastructure)"
    return standin


def _make_class(name: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        calls[name] += 1
        raise StandInError(
            f"exllamav3_ext.{name} is a CUDA-graph bound class; the CPU stand-in (overlay test infrastructure) "
            f"cannot construct it"
        )

    return type(name, (), {"__init__": __init__, "__doc__": f"CPU stand-in for exllamav3_ext.{name}"})


def build_module(sources_dir: Path, module: types.ModuleType | None = None) -> types.ModuleType:
    functions, classes, attrs = read_bindings(sources_dir)
    if not functions:
        raise StandInError(
            f"no pybind11 bindings found under {sources_dir}; is this an exllamav3 source tree?"
        )
    mod = module if module is not None else types.ModuleType(MODULE_NAME)
    for name in sorted(functions):
        setattr(mod, name, _make_function(name))
    for name in sorted(classes):
        setattr(mod, name, _make_class(name))
    for name, value in attrs.items():
        setattr(mod, name, value)
    mod.OVERLAY_STANDIN = True
    mod.calls = calls
    mod.REFERENCES = REFERENCES
    mod.StandInError = StandInError
    return mod


def _exllamav3_sources() -> Path | None:
    spec = importlib.util.find_spec("exllamav3")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / MODULE_NAME
        if (candidate / "bindings.cpp").is_file():
            return candidate
    return None


def _cuda_visible() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


class _Loader(importlib.abc.Loader):
    def __init__(self, sources_dir: Path) -> None:
        self.sources_dir = sources_dir

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        build_module(self.sources_dir, module)


class StandInFinder(importlib.abc.MetaPathFinder):
    """Answers for ``exllamav3_ext`` only, and only when no real extension can be used."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE_NAME or os.environ.get(ENV_SWITCH, "1") == "0" or _cuda_visible():
            return None
        real = importlib.machinery.PathFinder.find_spec(fullname, path)
        if real is not None:
            return None
        sources = _exllamav3_sources()
        if sources is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _Loader(sources), origin=str(sources / (MODULE_NAME + ORIGIN_SUFFIX))
        )


def install() -> None:
    """Put the finder on sys.meta_path once (idempotent)."""
    if not any(isinstance(f, StandInFinder) for f in sys.meta_path):
        sys.meta_path.append(StandInFinder())
