"""Drop-in proof: stock, then patched mlx-lm wheel installed with pip into one fresh venv, like a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlay.check.envs import _site_packages, deps_env
from overlay.core.build import apply_engine
from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import load_engine
from overlay.core.provenance import local_version
from overlay.core.series import Patch
from support import Cli

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.network


def pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
    )


def test_patched_mlx_lm_replaces_stock_in_place(tmp_path: Path, cli: Cli) -> None:
    from overlay.check import models as tinymodels

    manifest = load_engine(REPO, "mlx-lm")
    stock = fetch_artifact(REPO, manifest, manifest.upstream.primary)
    patched = apply_engine(root=REPO, engine="mlx-lm").wheel
    deps = deps_env(REPO, manifest)  # mlx[cpu] and the other runtime requirements, shared with the arms
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = _site_packages(venv)
    (site / "_deps.pth").write_text(str(_site_packages(deps)) + "\n")

    r = pip(venv, "install", "--no-index", str(stock))
    assert r.returncode == 0, r.stderr
    r = pip(venv, "install", "--no-index", str(patched))
    assert r.returncode == 0, r.stderr
    assert "Successfully uninstalled mlx-lm-0.32.2" in r.stdout
    listed = {d["name"]: d["version"] for d in json.loads(pip(venv, "list", "--format", "json").stdout)}
    assert listed["mlx-lm"] == local_version(manifest, _patches(), root=REPO)
    check = pip(venv, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    # `==UPSTREAM` still accepts the patched wheel: nothing to do
    same = pip(venv, "install", "--no-index", "mlx-lm==0.32.2")
    assert same.returncode == 0 and "Requirement already satisfied: mlx-lm==0.32.2" in same.stdout

    prov = cli("provenance", "mlx-lm", "--path", str(site), "--json")
    assert prov.code == 0, prov.err
    assert json.loads(prov.out)["series"]["sha256"].startswith(listed["mlx-lm"].rsplit(".g", 1)[1])

    model = tinymodels.build("llama-random", root=REPO)
    code = (
        "import mlx_lm, importlib.metadata as md\n"
        "from mlx_lm import load, generate\n"
        f"m, t = load({str(model)!r})\n"
        "text = generate(m, t, prompt='count: one two', max_tokens=8, verbose=False)\n"
        "print(mlx_lm.__version__, md.version('mlx-lm'), len(text) > 0)\n"
    )
    env_preload = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    if Path(env_preload).exists():
        env["LD_PRELOAD"] = env_preload
    run = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    module_version, dist_version, produced = run.stdout.split()
    assert module_version == "0.32.2" and dist_version == listed["mlx-lm"] and produced == "True"


def _patches() -> tuple[Patch, ...]:
    from overlay.core.series import load_engine_series

    return load_engine_series(REPO, load_engine(REPO, "mlx-lm")).patches
