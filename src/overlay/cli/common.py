"""What every sub-command shares: its parser (one-line help, example, the options several commands take), finding
the overlay repository (``--root`` or the nearest folder with overlays/), and turning path options into absolute
paths."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from overlay.core.manifest import find_root
from overlay.errors import UsageError

ENGINE_HELP: Final = "engine name (overlays/ENGINE.toml)"


def add_command(
    sub: Any,
    name: str,
    help_text: str,
    example: str,
    execute: Callable[[argparse.Namespace], int],
    *,
    notes: str = "",
) -> argparse.ArgumentParser:
    """The sub-command ``name``: ``help_text`` in the command list; in its ``--help``, the help, the example and any
    ``notes`` (a paragraph of their own). ``execute(args)`` runs it."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=f"{help_text}.\n\nexample: {example}" + (f"\n\n{notes}" if notes else ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(execute=execute)
    return p


def add_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("engine", help=ENGINE_HELP)


def add_offline(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offline", action="store_true", help="use cached artifacts only")


def add_wait(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when another overlay run holds the engine's lock, wait up to SECONDS for it (default: fail at once)",
    )


def add_python(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--python",
        type=Path,
        metavar="PATH",
        help="the environment's interpreter (default: the one running overlay)",
    )


def add_json(p: argparse.ArgumentParser, help_text: str = "print the result as JSON") -> None:
    p.add_argument("--json", action="store_true", help=help_text)


def resolved(path: Path | None) -> Path | None:
    """An optional path option made absolute (None stays None)."""
    return path.resolve() if path else None


def current_dir(*, needed_for: str = "finding the overlay repository") -> Path:
    """``Path.cwd()``, or a UsageError when the working directory was deleted (or moved away) under us."""
    try:
        return Path.cwd()
    except FileNotFoundError:
        raise UsageError(
            f"the current directory no longer exists (deleted or moved away); it is needed for {needed_for}",
            tip="cd into the overlay repository again, or pass --root DIR as an absolute path",
        ) from None


def resolve_root(args: argparse.Namespace) -> Path:
    root: Path | None = args.root
    if root is not None:
        if not root.is_absolute():
            root = current_dir(needed_for=f"the relative --root {root}") / root
        root = root.resolve()
        if not (root / "overlays").is_dir():
            raise UsageError(f"--root {root} has no overlays/ folder")
        return root
    return find_root(current_dir())
