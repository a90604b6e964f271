from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overlay.cli.main import main
from support import Cli, CliResult, World, add_two_patches, make_world


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path)


@pytest.fixture
def world2(world: World) -> World:
    """A world whose series holds two patches."""
    add_two_patches(world)
    return world


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    def run(*argv: str) -> CliResult:
        code = main(list(argv))
        captured = capsys.readouterr()
        return CliResult(code=code, out=captured.out, err=captured.err)

    return run


@pytest.fixture
def local_index(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """pip sees only a local folder of wheels (no network, no user configuration)."""

    def use(folder: Path) -> None:
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")

    return use
