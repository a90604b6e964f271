"""Static drop-in check: the patched wheel's public surface against the stock wheel's.

Read with the ``ast`` module from the wheel files (nothing is imported, so it works for engines that cannot run on this
machine): modules; public module-level functions and classes with their signatures; public methods of public classes;
console scripts and entry points. Reported: anything removed, and signatures changed incompatibly (a parameter removed
or renamed, one made required, positional order changed). Additions are listed but are compatible.
"""

from __future__ import annotations

import ast
import configparser
from dataclasses import dataclass
from typing import Any

from overlay.core.patching import MemoryTree


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # posonly | pos | vararg | kwonly | varkw
    has_default: bool


Signature = tuple[Param, ...]


def _params(args: ast.arguments) -> Signature:
    out: list[Param] = []
    pos = [*args.posonlyargs, *args.args]
    n_def = len(args.defaults)
    for i, a in enumerate(pos):
        kind = "posonly" if i < len(args.posonlyargs) else "pos"
        out.append(Param(a.arg, kind, i >= len(pos) - n_def))
    if args.vararg:
        out.append(Param(args.vararg.arg, "vararg", True))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append(Param(a.arg, "kwonly", d is not None))
    if args.kwarg:
        out.append(Param(args.kwarg.arg, "varkw", True))
    return tuple(out)


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__") and name == "__init__")


def module_surface(source: bytes) -> dict[str, Signature | None]:
    """``{qualname: signature}`` for public functions and classes (``None`` for a class itself, or a non-function)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[str, Signature | None] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
            out[node.name] = _params(node.args)
        elif isinstance(node, ast.ClassDef) and _public(node.name):
            out[node.name] = None
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(item.name):
                    out[f"{node.name}.{item.name}"] = _params(item.args)
    return out


def wheel_surface(tree: MemoryTree, dist_info: str) -> dict[str, Any]:
    modules: dict[str, dict[str, Signature | None]] = {}
    for path, data in tree.files.items():
        if not path.endswith(".py") or path.startswith(dist_info) or ".data/" in path.split("/", 1)[0] + "/":
            continue
        parts = path[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") and p != "__init__" for p in parts[1:]) or not parts:
            continue  # private modules are not part of the surface
        modules[".".join(parts)] = module_surface(data)
    entry = tree.read(f"{dist_info}/entry_points.txt")
    entry_points: dict[str, str] = {}
    if entry:
        cp = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        cp.optionxform = str  # type: ignore[assignment,method-assign]
        cp.read_string(entry.decode("utf-8"))
        for section in cp.sections():
            for key, value in cp.items(section):
                entry_points[f"{section}:{key}"] = value.strip()
    return {"modules": modules, "entry_points": entry_points}


def _incompatible(old: Signature, new: Signature) -> str | None:
    old_named = {p.name: p for p in old if p.kind not in ("vararg", "varkw")}
    new_named = {p.name: p for p in new if p.kind not in ("vararg", "varkw")}
    accepts_varkw = any(p.kind == "varkw" for p in new)
    for name, p in old_named.items():
        if name not in new_named:
            if p.kind in ("kwonly", "pos") and accepts_varkw:
                continue
            return f"parameter {name!r} removed"
        q = new_named[name]
        if p.has_default and not q.has_default:
            return f"parameter {name!r} lost its default"
        if p.kind in ("pos", "posonly") and q.kind == "kwonly":
            return f"parameter {name!r} became keyword-only"
    for name, q in new_named.items():
        if name not in old_named and not q.has_default:
            return f"new required parameter {name!r}"
    old_pos = [p.name for p in old if p.kind in ("pos", "posonly")]
    new_pos = [p.name for p in new if p.kind in ("pos", "posonly")]
    if new_pos[: len(old_pos)] != old_pos and all(n in new_pos for n in old_pos):
        return "positional parameters reordered"
    if any(p.kind == "vararg" for p in old) and not any(p.kind == "vararg" for p in new):
        return "*args removed"
    if any(p.kind == "varkw" for p in old) and not accepts_varkw:
        return "**kwargs removed"
    return None


def compare(stock: dict[str, Any], patched: dict[str, Any]) -> dict[str, Any]:
    removed: list[str] = []
    changed: list[dict[str, str]] = []
    added: list[str] = []
    for mod, names in stock["modules"].items():
        if mod not in patched["modules"]:
            removed.append(f"module {mod}")
            continue
        new = patched["modules"][mod]
        for name, sig in names.items():
            if name not in new:
                removed.append(f"{mod}.{name}")
            elif sig is not None and new[name] is not None:
                why = _incompatible(sig, new[name])
                if why:
                    changed.append({"symbol": f"{mod}.{name}", "why": why})
        added += [f"{mod}.{n}" for n in new if n not in names]
    added += [f"module {m}" for m in patched["modules"] if m not in stock["modules"]]
    for key, value in stock["entry_points"].items():
        if key not in patched["entry_points"]:
            removed.append(f"entry point {key}")
        elif patched["entry_points"][key] != value:
            changed.append(
                {"symbol": f"entry point {key}", "why": f"{value} -> {patched['entry_points'][key]}"}
            )
    added += [f"entry point {k}" for k in patched["entry_points"] if k not in stock["entry_points"]]
    n_symbols = sum(len(v) for v in stock["modules"].values())
    return {
        "modules": len(stock["modules"]),
        "symbols": n_symbols,
        "entry_points": len(stock["entry_points"]),
        "removed": sorted(removed),
        "changed": sorted(changed, key=lambda c: c["symbol"]),
        "added": sorted(added),
        "compatible": not removed and not changed,
    }
