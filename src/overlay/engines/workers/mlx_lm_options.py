"""The check's CLI-style options (``--draft-max-kv-size=64``, ``--adaptive-draft``: a patch's ``Overlay-Flag`` or an
mlx-lm option) as the keyword arguments of the mlx-lm function a task calls. Runs inside an arm; not imported by
overlay itself.

An option applies to a task when the function it calls (generate_step, speculative_generate_step) takes a parameter
of that name (``--draft-max-kv-size`` -> ``draft_max_kv_size``), read from the arm's own mlx-lm, so a stock arm
simply has fewer. A task's own argument of the same name wins (the check's ``max_tokens`` is the one compared), and
an option no parameter takes is left out. Every task reports both: ``options: {"applied": {...}, "unused": {name:
why}}``, so a check can say which options its comparisons ran with.
"""

from __future__ import annotations

import inspect
import json
from typing import Any


def value(raw: str | None) -> Any:
    """A CLI-style flag's value as a keyword argument: no value is True; JSON numbers and booleans are decoded."""
    if raw is None:
        return True
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return raw


def keyword(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def accepted(fn: Any) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind != p.VAR_KEYWORD}


def split(
    options: dict[str, str | None] | None, fn: Any, *, fixed: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, str]]:
    """(keyword arguments for ``fn``, {option: why it is not applied}) for the request's ``options``; ``fixed``:
    the parameters the task sets itself."""
    params = accepted(fn)
    kwargs: dict[str, Any] = {}
    unused: dict[str, str] = {}
    for name, raw in (options or {}).items():
        key = keyword(name)
        if key in fixed:
            unused[name] = f"the task sets {key} itself"
        elif key not in params:
            unused[name] = f"{fn.__name__} takes no {key}"
        else:
            kwargs[key] = value(raw)
    return kwargs, unused


def report(
    kwargs: dict[str, Any], unused: dict[str, str], options: dict[str, str | None] | None
) -> dict[str, Any]:
    applied = {name: raw for name, raw in (options or {}).items() if keyword(name) in kwargs}
    return {"applied": applied, "unused": unused}
