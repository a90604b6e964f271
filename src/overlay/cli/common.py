"""What every sub-command shares: finding the overlay repository (``--root`` or the nearest folder with overlays/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from overlay.core.manifest import find_root
from overlay.errors import UsageError


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
