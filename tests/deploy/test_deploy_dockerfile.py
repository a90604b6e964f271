"""docs/deploy.md's Dockerfile layer, performed step by step in a venv standing in for the upstream image: the RUN
lines exactly as the page writes them, /opt/overlay-index replaced by a copy of the published index."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy.deploy_support import REPO, make_venv, pip

pytestmark = pytest.mark.network


def dockerfile_runs() -> list[str]:
    text = (REPO / "docs" / "deploy.md").read_text()
    block = re.search(r"```dockerfile\n(.*?)```", text, re.S)
    assert block, "docs/deploy.md has no ```dockerfile block"
    lines = block.group(1).splitlines()
    assert any(line.startswith("COPY overlay-index /opt/overlay-index") for line in lines)
    return [line.removeprefix("RUN ") for line in lines if line.startswith("RUN ")]


def test_the_documented_layer_installs_and_asserts_the_patched_wheel(
    mlx_built: tuple[Path, Path], stock_wheel: Path, tmp_path: Path
) -> None:
    _wheels, index = mlx_built
    want = json.loads((index / "overlay-index.json").read_text())["wheel_version"]
    image = make_venv(tmp_path / "image")  # FROM: the upstream image, stock engine installed
    assert pip(image, "install", "--no-deps", "--no-index", str(stock_wheel)).returncode == 0
    opt = tmp_path / "opt" / "overlay-index"
    shutil.copytree(index, opt)  # COPY overlay-index /opt/overlay-index
    workdir = tmp_path / "srv"
    workdir.mkdir()
    env = {**os.environ, "PATH": f"{image.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    runs = dockerfile_runs()
    assert len(runs) == 2
    for step in runs:
        r = subprocess.run(
            step.replace("/opt/overlay-index", str(opt)),
            shell=True,
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, f"{step}\n{r.stdout}\n{r.stderr}"
    assert f"mlx-lm {want} installed" in r.stdout
    versions = {d["name"]: d["version"] for d in json.loads(pip(image, "list", "--format", "json").stdout)}
    assert versions["mlx-lm"] == want

    # the check fails the build when it should: run from a folder that holds a checkout of the package ...
    (workdir / "mlx_lm").mkdir()
    check = runs[-1].replace("/opt/overlay-index", str(opt))
    r = subprocess.run(check, shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "the working directory holds" in r.stderr
    shutil.rmtree(workdir / "mlx_lm")
    # ... and when the install step asks for `==UPSTREAM` over stock: "already satisfied", stock kept
    assert (
        pip(image, "install", "--no-deps", "--no-index", "--force-reinstall", str(stock_wheel)).returncode
        == 0
    )
    lax = (
        runs[0]
        .replace(" --force-reinstall", "")
        .replace(" --require-hashes", "")
        .replace("-r /opt/overlay-index/requirements.txt", "mlx-lm==0.32.2")
        .replace("/opt/overlay-index", str(opt))
    )
    r = subprocess.run(lax, shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "already satisfied" in r.stdout
    r = subprocess.run(check, shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "carries no overlay.json" in r.stderr
    # the published requirements pin the full local version: stock does not satisfy them, even without the flag
    plain = runs[0].replace(" --force-reinstall", "").replace("/opt/overlay-index", str(opt))
    r = subprocess.run(
        plain + " && " + check, shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
