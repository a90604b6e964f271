"""The functions and classes of a Python module with their line spans and dotted qualified names (``ast`` only)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Literal

MODULE = "<module>"


SymbolKind = Literal["function", "class"]


@dataclass(frozen=True)
class Symbol:
    qualname: str
    kind: SymbolKind
    start: int  # first line, decorators included (1-based)
    end: int  # last line
    def_line: int
    indent: int  # column of the def/class keyword

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]


def _decode(data: bytes | str) -> str:
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


def symbols(source: bytes | str) -> list[Symbol] | None:
    """Functions and classes of a module, outermost first; None when the source does not parse."""
    text = _decode(source)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    out: list[Symbol] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}{child.name}"
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                out.append(
                    Symbol(
                        qualname=qual,
                        kind="class" if isinstance(child, ast.ClassDef) else "function",
                        start=start,
                        end=child.end_lineno or child.lineno,
                        def_line=child.lineno,
                        indent=child.col_offset,
                    )
                )
                visit(child, qual + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    seen: dict[str, int] = {}
    for i, s in enumerate(out):  # a property's setter repeats its getter's name: call it name[2]
        n = seen[s.qualname] = seen.get(s.qualname, 0) + 1
        if n > 1:
            out[i] = Symbol(
                qualname=f"{s.qualname}[{n}]",
                kind=s.kind,
                start=s.start,
                end=s.end,
                def_line=s.def_line,
                indent=s.indent,
            )
    return out


def innermost(syms: list[Symbol], line: int) -> Symbol | None:
    best: Symbol | None = None
    for s in syms:
        if s.start <= line <= s.end and (best is None or (s.start >= best.start and s.end <= best.end)):
            best = s
    return best


def source_of(text: str, sym: Symbol) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[sym.start - 1 : sym.end])
