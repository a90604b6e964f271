"""`overlay apply exllamav3 --prebuilt`: scripts/build_exllamav3_ext.py (the manifest's [prebuilt] command).

On this machine torch is the CPU build, so the build itself cannot run: the tests check that the command refuses
with exit 2 and a message naming what is missing (CUDA torch, nvcc), directly and through `overlay apply`, and that
the manifest wires the command to the documented placeholders. The compile check of the patched translation units
needs nvcc and the CUDA library headers (cuBLAS, cuSPARSE, cuSOLVER, cuRAND); it runs when EXL3_CUDA_LIB_INCLUDE
names a folder holding them (slow).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from overlay.check.envs import Arm, Arms
from overlay.cli.main import main as overlay_main
from overlay.core.manifest import load_manifest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build_exllamav3_ext.py"


@pytest.fixture(scope="module")
def patched_tree(arms: Arms, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("exl3-tree")
    with zipfile.ZipFile(arms.patched.wheel) as whl:
        whl.extractall(tree)
    return tree


def _run(arm: Arm, *args: str) -> subprocess.CompletedProcess[str]:
    return arm.run([str(SCRIPT), *args], timeout=600)


def test_build_refuses_without_cuda_torch(arms: Arms, patched_tree: Path, tmp_path: Path) -> None:
    proc = _run(
        arms.patched,
        "--tree",
        str(patched_tree),
        "--out",
        str(tmp_path / "out"),
        "--info",
        str(tmp_path / "info.json"),
    )
    assert proc.returncode == 2, proc.stderr
    assert "CUDA torch" in proc.stderr and "nvcc" in proc.stderr and "CPU build" in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "info.json").exists()


def test_build_refuses_a_tree_without_sources(arms: Arms, tmp_path: Path) -> None:
    proc = _run(arms.patched, "--tree", str(tmp_path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "cuda_flags.py not found" in proc.stderr and "--tree" in proc.stderr


def test_apply_prebuilt_reports_the_missing_prerequisite(
    arms: Arms, repo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = load_manifest(repo_root / "overlays" / "exllamav3.toml")
    assert manifest.prebuilt is not None
    assert list(manifest.prebuilt.command[1:]) == [
        "scripts/build_exllamav3_ext.py",
        "--tree",
        "{tree}",
        "--out",
        "{out}",
        "--info",
        "{info}",
    ]
    assert manifest.prebuilt.tag == "cp{py}-cp{py}-linux_x86_64"
    code = overlay_main(
        [
            "--root",
            str(repo_root),
            "apply",
            "exllamav3",
            "--prebuilt",
            "--prebuilt-python",
            str(arms.patched.python),
            "--out",
            str(tmp_path),
            "--offline",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "CUDA torch" in err and "nvcc" in err and "TORCH_CUDA_ARCH_LIST" in err
    assert not list(tmp_path.glob("*.whl"))


PATCHED_UNITS = [
    "generator/gumbel.cu",
    "generator/sampling_fused.cu",
    "libtorch/mlp.cpp",
    "libtorch/blocksparse_mlp.cpp",
    "quant/exl3_moe_coop.cu",
    "bindings.cpp",
]


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("EXL3_CUDA_LIB_INCLUDE") or not shutil.which("nvcc"),
    reason="needs nvcc and EXL3_CUDA_LIB_INCLUDE (a folder with the cuBLAS/cuSPARSE/cuSOLVER/cuRAND "
    "headers, e.g. from the nvidia-* wheels)",
)
def test_patched_units_compile(arms: Arms, patched_tree: Path, tmp_path: Path) -> None:
    report = tmp_path / "units.json"
    proc = _run(
        arms.patched,
        "--tree",
        str(patched_tree),
        "--compile-check",
        *PATCHED_UNITS,
        "--include",
        os.environ["EXL3_CUDA_LIB_INCLUDE"],
        "--report",
        str(report),
    )
    doc = json.loads(report.read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [u["unit"] for u in doc["units"] if u["ok"]] == PATCHED_UNITS
