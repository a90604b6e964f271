from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overlay.cli.main import main
from support import Cli, CliResult, World, add_two_patches, make_world

# Folders whose tests run the repository's own engines and models: they use its build folder, which
# OVERLAY_BUILD_DIR / OVERLAY_CACHE_DIR may move or share (worktrees sharing arm venvs). Every other test builds its
# own world in tmp_path and must not read or write a build folder the environment names.
_REPO_BUILD_USERS = {"engines", "census", "check", "tinymodels"}


@pytest.fixture(autouse=True)
def _hermetic_build_dir(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    rel = Path(str(request.node.path)).resolve().relative_to(Path(__file__).resolve().parent)
    if rel.parts[0] not in _REPO_BUILD_USERS:
        monkeypatch.delenv("OVERLAY_BUILD_DIR", raising=False)
        monkeypatch.delenv("OVERLAY_CACHE_DIR", raising=False)


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
