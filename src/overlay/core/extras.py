"""Optional dependencies: what only `overlay check` and `overlay models` need lives in the `check` extra.

The core commands (list, fetch, lint, apply, provenance, checkout, refresh, rebase, review, pin, init) import none
of these; ``check`` and ``models`` call :func:`require_extra` first, so a missing one is a usage error naming the
command that installs it, instead of an ImportError deep inside a run.
"""

from __future__ import annotations

import importlib

from overlay import DISTRIBUTION
from overlay.errors import UsageError

EXTRAS: dict[str, tuple[str, ...]] = {"check": ("numpy", "safetensors", "tokenizers")}


def require_extra(extra: str, *, command: str) -> None:
    """UsageError (exit 2) naming every module of ``extra`` that cannot be imported, and the pip command."""
    missing: list[str] = []
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise UsageError(
            f"`overlay {command}` needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
            f"installed (the {extra!r} extra of {DISTRIBUTION})",
            tip=f"pip install '{DISTRIBUTION}[{extra}]' (into the environment that runs overlay)",
        )
