"""Where overlay writes, in one place: a :class:`Layout` per overlay repository.

Everything goes under ``ROOT/build`` (git-ignored) unless ``OVERLAY_BUILD_DIR`` names another folder (relative paths
are taken from the repository root). The artifact cache (pinned downloads, git mirrors, other releases) is
``BUILD/cache`` unless ``OVERLAY_CACHE_DIR`` names a folder that several repositories share: its entries are keyed
by sha256, so sharing it is safe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

BUILD_ENV = "OVERLAY_BUILD_DIR"
CACHE_ENV = "OVERLAY_CACHE_DIR"


@dataclass(frozen=True)
class Layout:
    root: Path
    build: Path
    cache: Path

    @property
    def wheels(self) -> Path:
        """Patched wheels (``overlay apply``'s default output)."""
        return self.build / "wheels"

    @property
    def check_wheels(self) -> Path:
        """The patched wheels ``overlay check`` runs (the series and the census's prefixes), cached by content."""
        return self.build / "check-wheels"

    @property
    def state(self) -> Path:
        """Last-build records per engine (``overlay list``)."""
        return self.build / "state"

    @property
    def tmp(self) -> Path:
        """Scratch folders, one per running command (pid-named, removed on exit or by the next run)."""
        return self.build / "tmp"

    @property
    def locks(self) -> Path:
        return self.build / "locks"

    @property
    def worktrees(self) -> Path:
        return self.build / "worktrees"

    @property
    def refresh(self) -> Path:
        """The refresh transaction's staging, backup and journal, per engine."""
        return self.build / "refresh"

    @property
    def rebase(self) -> Path:
        return self.build / "rebase"

    @property
    def rebase_history(self) -> Path:
        return self.build / "rebase-history"

    @property
    def reports(self) -> Path:
        return self.build / "reports"

    @property
    def venvs(self) -> Path:
        return self.build / "venvs"

    @property
    def models(self) -> Path:
        """The tiny models (generated locally)."""
        return self.build / "models"


def _from_env(name: str, root: Path) -> Path | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / path


def layout(root: Path) -> Layout:
    """The repository's layout, with ``OVERLAY_BUILD_DIR`` and ``OVERLAY_CACHE_DIR`` applied."""
    build = _from_env(BUILD_ENV, root) or root / "build"
    return Layout(root=root, build=build, cache=_from_env(CACHE_ENV, root) or build / "cache")


def build_dir(root: Path) -> Path:
    return layout(root).build
