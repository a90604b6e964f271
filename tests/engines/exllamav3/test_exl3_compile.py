"""The series' CUDA translation units compiled for sm_90 with ptxas' resource usage, patched vs stock
(scripts/build_exllamav3_ext.py --compile-check --against): registers, stack frame, spill stores and loads per kernel.

What is gated: a unit that does not compile (exit 1), and a kernel of the patched unit that spills where stock's
kernel of the same name did not, or more bytes than stock's, or a new kernel that spills (exit 4). Registers and
stack frame are reported, not gated. The units are derived from the two wheels' difference and the include graph,
never listed here:

- default suite: every translation unit the series changes that holds device code (``--select changed --suffix .cu``),
  both trees device-only (nvcc's front end over the whole unit, host code included, then ptxas; the host compiler's
  pass over the ATen headers, most of a full compile, is left to the long test): ~1.5 minutes on 2 cores;
- long: every unit an incremental build recompiles (``--select rebuild``: the changed units and every unit including a
  changed header, e.g. quant/comp_units/exl3_moe_coop_inst_*.cu through exl3_moe_coop.cuh, and bindings.cpp) compiled
  in full, and the units EXL3_OVL_BSZN=16's build define changes (``--select define``) with it set.

Needs nvcc (CI's machine image has nvcc 13.0 at /usr/local/bin/nvcc; skipped without it) and the cuBLAS, cuSPARSE,
cuSOLVER and cuRAND headers, which the toolkit here lacks: the pinned nvidia-* wheels' headers, fetched once into the
artifact cache (``--fetch-cuda-headers``; 830 MB of wheels downloaded, 3.2 MB of headers kept). The reports go to
build/reports/exllamav3-compile-check*.json.
"""

from __future__ import annotations

import filecmp
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from overlay.check.envs import Arms
from overlay.paths import layout

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build_exllamav3_ext.py"
EXT = Path("exllamav3") / "exllamav3_ext"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_exllamav3_ext", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trees(arms: Arms, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, arm in (("stock", arms.stock), ("patched", arms.patched)):
        tree = tmp_path_factory.mktemp(f"exl3-{name}")
        with zipfile.ZipFile(arm.wheel) as whl:
            whl.extractall(tree)
        out[name] = tree
    return out


@pytest.fixture(scope="module")
def cuda_headers(repo_root: Path) -> Path:
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc (the CUDA toolkit)")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--fetch-cuda-headers", str(layout(repo_root).cache)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    include = Path(proc.stdout.strip().splitlines()[-1])
    assert (include / "cublas_v2.h").is_file() and (include / "curand_kernel.h").is_file()
    return include


def _compile_check(
    arms: Arms, tree: Path, *args: str, report: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = arms.patched.run(
        [str(SCRIPT), "--tree", str(tree), "--compile-check", *args, "--report", str(report)],
        timeout=3600,
        extra_env=env,
    )
    doc = json.loads(report.read_text()) if report.is_file() else {}
    return proc, doc


def _changed(trees: dict[str, Path]) -> tuple[set[str], set[str]]:
    """The files of the extension the series changes, and the translation units that include one of them directly
    (the test's own reading of the two trees, independent of the script's include graph)."""
    stock, patched = trees["stock"] / EXT, trees["patched"] / EXT
    changed = {
        p.relative_to(patched).as_posix()
        for p in patched.rglob("*")
        if p.is_file()
        and (
            not (stock / p.relative_to(patched)).is_file()
            or not filecmp.cmp(p, stock / p.relative_to(patched))
        )
    }
    direct = set()
    for unit in patched.rglob("*"):
        if unit.suffix not in (".cu", ".cpp") or "rocm" in unit.parts:
            continue
        for inc in re.findall(r'#\s*include\s+"([^"]+)"', unit.read_text(errors="replace")):
            target = (unit.parent / inc).resolve()
            if (
                target.is_file()
                and target.is_relative_to(patched.resolve())
                and target.relative_to(patched.resolve()).as_posix() in changed
            ):
                direct.add(unit.relative_to(patched).as_posix())
    return changed, direct


def _assert_compiled(doc: dict[str, Any], units: list[str]) -> None:
    assert [u["unit"] for u in doc["units"]] == units
    for u in doc["units"]:
        assert u["ok"], (u["unit"], u["errors"])
        if u["unit"].endswith(".cu"):
            assert u["functions"], f"{u['unit']}: ptxas reported no function"
            assert all(f.get("registers", 0) > 0 for f in u["functions"] if f["entry"])
    assert doc["gate"] == {"compile_errors": [], "new_spills": [], "ok": True}
    assert doc["archs"] == ["9.0"]


@needs_nvcc
@pytest.mark.slow  # ~1.5 min on 2 cores (device code of 3 units, stock and patched)
def test_changed_cuda_units_compile_without_new_spills(
    arms: Arms, trees: dict[str, Path], cuda_headers: Path, repo_root: Path
) -> None:
    report = layout(repo_root).reports / "exllamav3-compile-check.json"
    proc, doc = _compile_check(
        arms,
        trees["patched"],
        "--against",
        str(trees["stock"]),
        "--select",
        "changed",
        "--suffix",
        ".cu",
        "--device-only",
        "--include",
        str(cuda_headers),
        "--jobs",
        "2",
        report=report,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    changed, _ = _changed(trees)
    units = sorted(u for u in changed if u.endswith(".cu"))
    assert units, "the series changes no .cu: this test would check nothing"
    _assert_compiled(doc, units)
    for u in doc["units"]:  # each against stock's own device code
        assert u["mode"] == "device" and u["baseline"]["ok"] and u["baseline"]["functions"]
    rows = doc["kernels"]
    assert {r["unit"] for r in rows} == set(units)
    for r in rows:
        assert r["patched"] is not None or r["stock"] is not None
        if r["patched"] and r["entry"]:
            assert r["patched"]["registers"] > 0 and r["patched"]["spill_stores"] is not None
    # 0014's row-seeded kernels are new (no stock kernel of that name), the rest are matched with stock's
    assert any(r["function"].startswith("void gumbel_noise_rows_kernel<") and not r["matched"] for r in rows)
    assert sum(r["matched"] for r in rows) >= len(rows) - 3


@pytest.fixture(scope="module")
def toy_trees(trees: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two one-kernel exllamav3 trees with upstream's util/cuda_flags.py: stock's kernel fits its registers
    (launch bounds 128 x 2), the patched one is bounded to 1024 x 2 threads (32 registers) and spills; "broken" does
    not compile."""
    kernel = """
template <int N>
__global__ void __launch_bounds__(THREADS, 2) pressure_kernel(const float* __restrict__ x, float* __restrict__ y)
{
    float acc[N];
    #pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = x[threadIdx.x + i * blockDim.x];
    #pragma unroll
    for (int r = 0; r < 4; ++r)
    {
        #pragma unroll
        for (int i = 0; i < N; ++i) acc[i] = acc[i] * acc[(i * 7 + r + 1) % N] + x[i];
    }
    float s = 0.0f;
    #pragma unroll
    for (int i = 0; i < N; ++i) s += acc[i] * (float) i;
    y[threadIdx.x] = s;
}
template __global__ void pressure_kernel<64>(const float*, float*);
"""
    out = {}
    for name, body in (
        ("stock", "#define THREADS 128\n" + kernel),
        ("patched", "#define THREADS 1024\n" + kernel),
        ("broken", "#define THREADS 128\n" + kernel + "\nvoid host_side() { undeclared_thing(); }\n"),
    ):
        root = tmp_path_factory.mktemp(f"toy-{name}")
        (root / EXT).mkdir(parents=True)
        (root / "exllamav3" / "util").mkdir()
        shutil.copyfile(
            trees["stock"] / "exllamav3" / "util" / "cuda_flags.py",
            root / "exllamav3" / "util" / "cuda_flags.py",
        )
        (root / EXT / "bindings.cpp").write_text("// bindings of the toy extension\n")
        (root / EXT / "pressure.cu").write_text(body)
        out[name] = root
    return out


@needs_nvcc
def test_spill_gate_fails_on_a_new_spill(arms: Arms, toy_trees: dict[str, Path], tmp_path: Path) -> None:
    against = ["--against", str(toy_trees["stock"]), "--select", "changed", "--suffix", ".cu"]
    proc, doc = _compile_check(arms, toy_trees["patched"], *against, report=tmp_path / "spill.json")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    (row,) = doc["kernels"]
    assert row["function"] == "void pressure_kernel<64>" and row["matched"] and row["new_spill"]
    assert row["stock"]["spill_stores"] == 0 and row["patched"]["spill_stores"] > 0
    assert row["stock"]["registers"] > 32 >= row["patched"]["registers"]
    assert doc["gate"]["new_spills"] == ["pressure.cu: void pressure_kernel<64>(float const*, float*)"]
    assert "NEW SPILL" in proc.stdout
    # the same kernel against itself: no new spill (spilling as much as stock is not new)
    proc, doc = _compile_check(
        arms,
        toy_trees["patched"],
        "pressure.cu",
        "--against",
        str(toy_trees["patched"]),
        report=tmp_path / "same.json",
    )
    assert proc.returncode == 0 and doc["gate"]["ok"], proc.stdout + proc.stderr


@needs_nvcc
def test_compile_error_fails_the_check(arms: Arms, toy_trees: dict[str, Path], tmp_path: Path) -> None:
    # a host-code error is found by the device-only compile too (nvcc's front end reads the whole unit)
    proc, doc = _compile_check(
        arms,
        toy_trees["broken"],
        "--against",
        str(toy_trees["stock"]),
        "--select",
        "changed",
        "--device-only",
        report=tmp_path / "broken.json",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert doc["gate"]["compile_errors"] == ["pressure.cu"] and not doc["gate"]["ok"]
    assert any("undeclared_thing" in line for line in doc["units"][0]["errors"])


def test_kernels_are_matched_across_a_new_parameter() -> None:
    """A patch that adds a parameter to a kernel keeps it matched with stock's (same name and template arguments);
    a kernel only the patched unit has is new, and spilling there is a new spill."""
    bx = _script()
    stock = bx.parse_ptxas(
        "ptxas info    : Compiling entry function '_Z4kernILi1EEvPKfi' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z4kernILi1EEvPKfi\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 37 registers, used 1 barriers, 64 bytes smem\n"
    )
    patched = bx.parse_ptxas(
        "ptxas info    : Compiling entry function '_Z4kernILi1EEvPKfib' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z4kernILi1EEvPKfib\n"
        "    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 29 registers, used 1 barriers, 64 bytes smem\n"
        "ptxas info    : Compiling entry function '_Z5extrav' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z5extrav\n"
        "    16 bytes stack frame, 16 bytes spill stores, 16 bytes spill loads\n"
        "ptxas info    : Used 32 registers, used 0 barriers, 16 bytes cumulative stack size\n"
    )
    assert stock == [
        {
            "name": "_Z4kernILi1EEvPKfi",
            "arch": "sm_90",
            "entry": True,
            "stack": 0,
            "spill_stores": 0,
            "spill_loads": 0,
            "registers": 37,
            "barriers": 1,
            "smem": 64,
        }
    ]
    rows = {r["function"]: r for r in bx.compare_functions("u.cu", patched, stock)}
    if shutil.which("c++filt"):
        assert set(rows) == {"void kern<1>", "extra"}
        kern, extra = rows["void kern<1>"], rows["extra"]
        assert kern["matched"] and not kern["new_spill"]
        assert (kern["stock"]["registers"], kern["patched"]["registers"]) == (37, 29)
        assert kern["patched"]["stack"] == 8
        assert not extra["matched"] and extra["new_spill"] and extra["stock"] is None
    # no baseline (no --against): reported, nothing is new
    assert not any(r["new_spill"] for r in bx.compare_functions("u.cu", patched, None))
    assert bx.function_key("void f<(anonymous namespace)::T, 2>(int (*)(int), float)") == (
        "void f<(anonymous namespace)::T, 2>"
    )


@needs_nvcc
@pytest.mark.long  # every unit an incremental build recompiles (17 of 194 for the 22-patch series), in full
def test_rebuilt_units_compile_in_full(
    arms: Arms, trees: dict[str, Path], cuda_headers: Path, repo_root: Path
) -> None:
    report = layout(repo_root).reports / "exllamav3-compile-check-rebuild.json"
    proc, doc = _compile_check(
        arms,
        trees["patched"],
        "--against",
        str(trees["stock"]),
        "--select",
        "rebuild",
        "--include",
        str(cuda_headers),
        report=report,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    changed, direct = _changed(trees)
    units = [u["unit"] for u in doc["units"]]
    # every changed unit and every unit including a changed header directly (the script follows the includes
    # further: headers including changed headers)
    assert {u for u in changed if u.endswith((".cu", ".cpp"))} | direct <= set(units)
    assert "quant/comp_units/exl3_moe_coop_inst_k4.cu" in units and "bindings.cpp" in units
    _assert_compiled(doc, units)
    assert all(u["mode"] == "full" for u in doc["units"])


@needs_nvcc
@pytest.mark.long  # 3 host units with the torch headers, ~5 min on 2 cores
def test_bszn16_units_compile(
    arms: Arms, trees: dict[str, Path], cuda_headers: Path, repo_root: Path
) -> None:
    report = layout(repo_root).reports / "exllamav3-compile-check-bszn16.json"
    proc, doc = _compile_check(
        arms,
        trees["patched"],
        "--against",
        str(trees["stock"]),
        "--select",
        "define",
        "--include",
        str(cuda_headers),
        report=report,
        env={"EXL3_OVL_BSZN": "16"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert doc["defines"] == ["-DEXL3_OVL_MAX_BSZN=16"]
    units = [u["unit"] for u in doc["units"]]
    # the define is read in libtorch/mlp.h: its includers, directly or through blocksparse_mlp.h
    assert {"libtorch/mlp.cpp", "libtorch/blocksparse_mlp.cpp", "bindings.cpp"} <= set(units)
    _assert_compiled(doc, units)
