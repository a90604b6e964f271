"""`overlay apply exllamav3 --prebuilt`: scripts/build_exllamav3_ext.py (the manifest's [prebuilt] command).

On this machine torch is the CPU build, so the build itself cannot run: the tests check that the command refuses
with exit 2 and a message naming what is missing (CUDA torch, nvcc), directly and through `overlay apply`, and that
the manifest wires the command to the documented placeholders, and that the build passes the tree's build-time
defines (0015) to torch's builder, recorded in place of a build. The compile check of the translation units the series
changes is test_exl3_compile.py.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from overlay.check.envs import Arm, Arms
from overlay.cli.main import main as overlay_main
from overlay.core.manifest import load_manifest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build_exllamav3_ext.py"


@pytest.fixture(scope="module")
def stock_tree(arms: Arms, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("exl3-stock-tree")
    with zipfile.ZipFile(arms.stock.wheel) as whl:
        whl.extractall(tree)
    return tree


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


# the build with torch's JIT builder recorded instead of run (CPU torch passes for CUDA torch: the flags are what is
# checked, not the compiler)
RECORD_BUILD = r"""
import json, sys, types
from pathlib import Path
import torch
import torch.utils.cpp_extension as cpp_extension

spec = __import__("importlib.util").util.spec_from_file_location("bx", sys.argv[1])
bx = __import__("importlib.util").util.module_from_spec(spec)
spec.loader.exec_module(bx)
torch.version.cuda = "13.0"
bx.find_nvcc = lambda cuda_flags, torch: ["/bin/true"]
seen = {}

def load(**kwargs):
    seen.update(kwargs)
    Path(kwargs["build_directory"], "exllamav3_ext.so").write_bytes(b"")

cpp_extension.load = load
code = bx.main(sys.argv[2:])
print(json.dumps({"code": code, "extra_cflags": seen.get("extra_cflags"),
                  "extra_cuda_cflags": seen.get("extra_cuda_cflags"), "sources": len(seen.get("sources") or [])}))
"""


@pytest.mark.parametrize(
    ("tree", "bszn", "defines"),
    [("patched", "16", ["-DEXL3_OVL_MAX_BSZN=16"]), ("patched", None, []), ("stock", "16", [])],
)
def test_build_passes_the_trees_build_defines(
    arms: Arms,
    patched_tree: Path,
    stock_tree: Path,
    tmp_path: Path,
    tree: str,
    bszn: str | None,
    defines: list[str],
) -> None:
    """0015: with EXL3_OVL_BSZN=16 the patched ext.py JIT-builds with -DEXL3_OVL_MAX_BSZN=16 for both compilers
    (util/cuda_flags.py ovl_build_defines); the prebuilt build (overlay apply --prebuilt, the device script's builds)
    must pass the same, or its extension keeps 8 graph slots per MLP while the Python side asks for 16."""
    root = patched_tree if tree == "patched" else stock_tree
    env = {"EXL3_OVL_BSZN": bszn} if bszn else {}
    proc = arms.patched.run(
        [
            "-c",
            RECORD_BUILD,
            str(SCRIPT),
            "--tree",
            str(root),
            "--out",
            str(tmp_path / "out"),
            "--info",
            str(tmp_path / "info.json"),
            "--arch-list",
            "9.0",
            "--build-dir",
            str(tmp_path / "b"),
        ],
        timeout=300,
        extra_env={"EXL3_OVL_BSZN": "", **env},
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["code"] == 0 and seen["sources"] > 150
    # the defines, once each, in the C++ and the CUDA flags
    for flags in (seen["extra_cflags"], seen["extra_cuda_cflags"]):
        assert [f for f in flags if f.startswith("-DEXL3_OVL_")] == defines
    info = json.loads((tmp_path / "info.json").read_text())
    assert info["defines"] == defines
