"""JSON Schemas (draft 2020-12) of the documents overlay writes, generated from their types
(:mod:`overlay.schemas.documents`) and shipped as ``overlay/schemas/NAME.schema.json``:

    python -m overlay.schemas          # rewrite the shipped files from the types
    python -m overlay.schemas --check  # exit 1 when a shipped file is stale

Tools that read overlay's reports can validate against these files; the tests validate real documents with them.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, NotRequired, Union, get_args, get_origin, is_typeddict

from overlay.schemas.documents import DOCUMENTS

HERE = Path(__file__).parent
DRAFT = "https://json-schema.org/draft/2020-12/schema"

__all__ = ["DOCUMENTS", "generate", "load", "path_of", "render"]


def _schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = get_origin(tp)
    if tp is Any:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a, defs) for a in get_args(tp)]}
    if origin is list:
        (item,) = get_args(tp)
        return {"type": "array", "items": _schema(item, defs)}
    if origin is dict:
        key, value = get_args(tp)
        if key is not str:
            raise TypeError(f"JSON object keys are strings, not {key}")
        return {"type": "object", "additionalProperties": _schema(value, defs)}
    if is_typeddict(tp):
        name = tp.__name__.lstrip("_")
        if name not in defs:
            defs[name] = {}  # placeholder: recursive references
            hints = typing.get_type_hints(tp, include_extras=True)
            props = {}
            for key, hint in hints.items():
                if get_origin(hint) is NotRequired:
                    (hint,) = get_args(hint)
                props[key] = _schema(hint, defs)
            defs[name] = {
                "type": "object",
                "properties": props,
                "required": sorted(tp.__required_keys__),
                "additionalProperties": False,
            }
            if tp.__doc__ and not tp.__doc__.startswith(name + "("):
                defs[name]["description"] = " ".join(tp.__doc__.split())
        return {"$ref": f"#/$defs/{name}"}
    raise TypeError(f"no JSON Schema for {tp!r}")


def generate(name: str) -> dict[str, Any]:
    """The JSON Schema of document ``name`` (a key of DOCUMENTS)."""
    defs: dict[str, Any] = {}
    root = _schema(DOCUMENTS[name], defs)
    head = {"$schema": DRAFT, "$id": f"https://overlay.invalid/schemas/{name}.schema.json"}
    if "$ref" not in root:  # a union of documents (the worker requests): anyOf their definitions
        return {**head, "title": name, **root, "$defs": dict(sorted(defs.items()))}
    top = root["$ref"].rsplit("/", 1)[1]
    body = defs.pop(top)
    return {**head, "title": top, **body, "$defs": dict(sorted(defs.items()))}


def render(name: str) -> str:
    return json.dumps(generate(name), indent=2, sort_keys=False) + "\n"


def path_of(name: str) -> Path:
    return HERE / f"{name}.schema.json"


def load(name: str) -> dict[str, Any]:
    """The shipped schema of document ``name``."""
    data: dict[str, Any] = json.loads(path_of(name).read_text(encoding="utf-8"))
    return data
