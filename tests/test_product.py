"""The tool as a product: its own wheel, installed into a fresh venv outside this repository, starts a patch
repository for mlx-lm 0.32.1 from the package index, adds a patch through checkout/commit/refresh, lints and applies
it, and the patched wheel installs with pip and carries its provenance.

Network (the package index: setuptools for the build, the tool's core dependencies, mlx-lm's release files) and slow
(three venvs, about a minute on 2 cores): `pytest -m "network and slow" tests/test_product.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import git

pytestmark = [pytest.mark.network, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
TRAILERS = """\
Overlay-Theme: other
Overlay-Numerics: exact
Overlay-Check: tests/test_mlx_lm.py::test_version_string
Upstream-Status: Inappropriate demonstration of the workflow
Overlay-Flag: default
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(*args: str | Path, cwd: Path, timeout: int = 300) -> str:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"{args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path / "bin"


def test_the_installed_wheel_starts_a_patch_repository_and_builds_a_patched_engine(tmp_path: Path) -> None:
    # the tool's wheel, built from a copy of its sources (the build leaves nothing in this repository)
    src = tmp_path / "tool-src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, src, cwd=tmp_path, timeout=600)
    (tool_wheel,) = dist.glob("*.whl")
    assert tool_wheel.name.startswith("engine_overlay-")
    with zipfile.ZipFile(tool_wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Name: engine-overlay\n" in meta and "License-Expression: Apache-2.0\n" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "patches/", "overlays/", "support/")) for n in names)
    assert not any("testbackends" in n or "/fixtures/" in n for n in names), (
        "stand-ins or fixtures in the wheel"
    )
    assert any(n.startswith("overlay/schemas/") and n.endswith(".schema.json") for n in names)
    cwc = Path(sys.executable).parent / "check-wheel-contents"
    _run(cwc, tool_wheel, cwd=tmp_path)  # no duplicates, no stray top-level modules, no __pycache__
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    core = [r for r in requires if "extra ==" not in r]
    assert not any(m in r for r in core for m in ("numpy", "safetensors", "tokenizers", "rich")), core

    # installed with its core dependencies only (no [check] extra), outside this repository
    tool = _venv(tmp_path / "tool-venv")
    _run(tool / "pip", "install", "-q", tool_wheel, cwd=tmp_path)
    overlay = tool / "overlay"
    where = _run(tool / "python", "-c", "import overlay; print(overlay.__file__)", cwd=tmp_path)
    assert str(tmp_path / "tool-venv") in where and str(REPO) not in where

    repo = tmp_path / "my-patches"
    repo.mkdir()
    out = _run(overlay, "init", "mlx-lm", "--version", "0.32.1", cwd=repo)
    assert "Overlay-Flag:" in out and (repo / ".git").is_dir()
    assert (repo / "patches" / "mlx-lm" / "series").read_text() == "# base: mlx-lm 0.32.1 -\n"
    manifest = (repo / "overlays" / "mlx-lm.toml").read_text()
    assert (
        'filename = "mlx_lm-0.32.1-py3-none-any.whl"' in manifest
        and 'filename = "mlx_lm-0.32.1.tar.gz"' in manifest
    )

    _run(overlay, "checkout", "mlx-lm", cwd=repo)
    wt = repo / "build" / "worktrees" / "mlx-lm"
    init_py = wt / "mlx_lm" / "__init__.py"
    init_py.write_text(init_py.read_text() + "\nOVERLAY_DEMO = True\n")
    git(
        wt,
        "commit",
        "-q",
        "-am",
        "init: mark the package as patched\n\nAdds OVERLAY_DEMO to mlx_lm, to show the "
        "workflow of a new patch repository. Nothing measured: no behaviour changes.\n\n" + TRAILERS,
    )
    _run(overlay, "refresh", "mlx-lm", cwd=repo)
    patches = sorted((repo / "patches" / "mlx-lm").glob("*.patch"))
    assert [p.name for p in patches] == ["0001-init-mark-the-package-as-patched.patch"]

    lint = subprocess.run(
        [str(overlay), "lint", "mlx-lm"], cwd=repo, env=_env(), capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stderr
    assert (
        "Overlay-Check 'tests/test_mlx_lm.py::test_version_string' is not in this repository" in lint.stderr
    )
    wheel = Path(_run(overlay, "-q", "apply", "mlx-lm", cwd=repo).strip().splitlines()[-1])
    assert wheel.name.startswith("mlx_lm-0.32.1+ovl.") and ".1.g" in wheel.name and wheel.is_file()

    # the patched wheel installs with pip in place of the stock one, and says what it was built from
    target = _venv(tmp_path / "target-venv")
    _run(target / "pip", "install", "-q", "--no-deps", wheel, cwd=tmp_path)
    site = _run(
        target / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
    )
    prov = json.loads(_run(overlay, "provenance", "mlx-lm", "--path", site.strip(), "--json", cwd=repo))
    assert prov["version"] == 1 and prov["tool"]["name"] == "overlay" and prov["engine"] == "mlx-lm"
    assert prov["upstream"]["version"] == "0.32.1"
    assert [p["name"] for p in prov["series"]["patches"]] == [patches[0].name]
    installed = Path(site.strip()) / "mlx_lm" / "__init__.py"
    assert installed.read_text().endswith("\nOVERLAY_DEMO = True\n")
