"""Stock vs patched arms for per-patch tests (docs/dev/patch-authoring.md section 4).

`arms` gives the engine of the test's folder (tests/engines/mlx_lm -> mlx-lm): the pinned upstream wheel and the wheel
`overlay apply` builds from the whole series, each installed by pip into its own venv over one shared deps venv.
Everything is cached under build/, so only the first test of a session pays for venvs and wheel builds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from overlay.check.envs import Arms, arms_for

REPO = Path(__file__).resolve().parents[2]
ENGINE_BY_FOLDER = {"mlx_lm": "mlx-lm", "sglang": "sglang", "exllamav3": "exllamav3"}
_CACHE: dict[tuple[str, int | None], Arms] = {}


def get_arms(engine: str, upto: int | None = None) -> Arms:
    key = (engine, upto)
    if key not in _CACHE:
        _CACHE[key] = arms_for(REPO, engine, upto=upto)
    return _CACHE[key]


@pytest.fixture(scope="module")
def arms(request: pytest.FixtureRequest) -> Arms:
    folder = Path(str(request.module.__file__)).parent.name
    engine = ENGINE_BY_FOLDER.get(folder)
    if engine is None:
        raise RuntimeError(f"tests/engines/{folder}: no engine mapped in ENGINE_BY_FOLDER")
    return get_arms(engine)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
