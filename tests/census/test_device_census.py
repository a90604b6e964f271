"""The GPU instrument's pure parts (src/overlay/engines/workers/cuda_census.py: trace counting, interleaving, ratio
intervals) and the ExLlamaV3 device script's build plan (only the changed units rebuilt per arm), on CPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


cc = _load("cuda_census", REPO / "src" / "overlay" / "engines" / "workers" / "cuda_census.py")
exl3 = _load("exllamav3_check", REPO / "scripts" / "device" / "exllamav3_check.py")


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: object) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_trace_counts_eager_and_graph_launches_copies_and_sites() -> None:
    torch_dir = "/env/lib/python3.12/site-packages/torch/"
    trace = {
        "traceEvents": [
            _x("python_function", "sglang/srt/speculative/eagle_utils.py(238): build_chain_tree", 0, 100),
            _x("python_function", f"{torch_dir}_tensor.py(40): wrapped", 10, 20),
            _x("cuda_runtime", "cudaLaunchKernel", 15, 1, correlation=1),
            _x("cuda_runtime", "cudaMemcpyAsync", 50, 1, correlation=2),
            _x("cuda_runtime", "cudaGraphLaunch", 200, 1, correlation=3),
            _x("cuda_runtime", "cudaMemcpyAsync", 300, 1, correlation=4),
            _x("kernel", "void at::native::vectorized_elementwise_kernel<4>", 16, 2, tid=7, correlation=1),
            _x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 51, 1, tid=7, correlation=2, bytes=64),
            _x("kernel", "triton_poi_fused_0", 201, 1, tid=7, correlation=3),
            _x("kernel", "triton_poi_fused_1", 202, 1, tid=7, correlation=3),
            _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 301, 1, tid=7, correlation=4, bytes=16),
            {"ph": "i", "name": "marker"},
        ]
    }
    parsed = cc.parse_trace(trace, torch_dir=torch_dir)
    counts = parsed["counts"]
    assert counts["eager-launches"] == 1 and counts["graph-launches"] == 2
    assert counts["h2d-copies"] == 1 and counts["pageable-copies"] == 1
    assert counts["bytes-moved"] == 64 + 16
    # the launch's site is the innermost Python frame outside torch
    assert parsed["sites"]["eager-launches"] == {"sglang/srt/speculative/eagle_utils.py:238": 1}
    assert parsed["sites"]["pageable-copies"] == {"sglang/srt/speculative/eagle_utils.py:238": 1}
    assert parsed["kinds"]["bytes-moved:d2h"] == 16


def _op(name: str, ts: float, dur: float, dims: list[list[int]], types: list[str]) -> dict[str, object]:
    event = _x("cpu_op", name, ts, dur)
    event["args"] = {"Input Dims": dims, "Input type": types}
    return event


def test_trace_gemm_bytes_are_the_outer_matrix_multiplies_operands() -> None:
    """The shape of a real torch 2.13 trace with record_shapes (CPU profile of F.linear in bf16 and torch._scaled_mm):
    linear -> matmul -> mm, and the CPU _scaled_mm's own dequantized mm nested inside it, counted once as the outer
    op; 0-dim scales count 4 bytes each, non-tensor arguments nothing."""
    bf16, fp8 = "c10::BFloat16", "c10::Float8_e4m3fn"
    trace = {
        "traceEvents": [
            _x("python_function", "sglang/srt/layers/logits_processor.py(1181): _compute_lm_head", 0, 100),
            _op("aten::linear", 1, 10, [[1, 6], [4, 6], []], [bf16, bf16, ""]),
            _op("aten::matmul", 2, 8, [[1, 6], [6, 4]], [bf16, bf16]),
            _op("aten::mm", 3, 6, [[1, 6], [6, 4]], [bf16, bf16]),
            _op(
                "aten::_scaled_mm",
                20,
                30,
                [[16, 32], [32, 16], [], [], [], [], [], []],
                [fp8, fp8, "float", "float", "", "", "Scalar", "Scalar"],
            ),
            _op("aten::mm", 25, 10, [[16, 32], [32, 16]], ["float", "float"]),
            _op("aten::mm", 200, 5, [[2, 3], [3, 2]], ["float", "float"]),
        ]
    }
    parsed = cc.parse_trace(trace, torch_dir="/env/torch/")
    assert parsed["counts"]["gemm-bytes"] == 60 + 1032 + 48
    assert parsed["kinds"]["gemm-bytes:_scaled_mm"] == 2 * 16 * 32 + 2 * 4
    assert parsed["sites"]["gemm-bytes"]["sglang/srt/layers/logits_processor.py:1181"] == 60 + 1032
    assert parsed["sites"]["gemm-bytes"]["op:aten::mm"] == 48  # outside every Python frame of the trace


def test_interleave_is_abba() -> None:
    assert cc.interleave(["stock", "off", "on"], 3) == [
        "stock",
        "off",
        "on",
        "on",
        "off",
        "stock",
        "stock",
        "off",
        "on",
    ]


def test_ratio_interval_brackets_the_ratio_and_says_which_side_is_faster() -> None:
    stock = [10.0 + 0.1 * (i % 5) for i in range(40)]
    patched = [5.0 + 0.1 * (i % 3) for i in range(40)]
    r = cc.ratio_interval(stock, patched)
    assert r["ratio"] > 1.9 and r["ci"][0] <= r["ratio"] <= r["ci"][1] and r["ci"][0] > 1.5
    same = cc.ratio_interval(stock, stock)
    assert same["ci"][0] <= 1.0 <= same["ci"][1]
    assert cc.ratio_interval([], patched)["ratio"] is None


def test_changed_units_and_their_includers_are_what_the_patched_arm_rebuilds(tmp_path: Path) -> None:
    stock, patched = tmp_path / "stock", tmp_path / "patched"
    files = {
        "bindings.cpp": '#include "generator/gumbel.cuh"\n#include "add.cuh"\n',
        "generator/gumbel.cuh": "#pragma once\n",
        "generator/gumbel.cu": '#include "gumbel.cuh"\n',
        "generator/other.cu": '#include "../add.cuh"\n',
        "add.cuh": "#pragma once\n",
        "add.cu": '#include "add.cuh"\n',
    }
    for root in (stock, patched):
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    (patched / "generator" / "gumbel.cuh").write_text("#pragma once\n// rows\n")
    (patched / "generator" / "rows.cu").write_text('#include "gumbel.cuh"\n')
    diff = exl3.changed_files(stock, patched)
    assert diff == {"added": ["generator/rows.cu"], "removed": [], "changed": ["generator/gumbel.cuh"]}
    units = exl3.dependent_units(patched, set(diff["added"]) | set(diff["changed"]))
    assert units == ["bindings.cpp", "generator/gumbel.cu", "generator/rows.cu"]


def test_the_shared_extension_option_is_refused() -> None:
    assert exl3.main(["--shared-ext", "--dry-run"]) == 2


def test_the_fused_sampler_is_left_on_on_the_gpu(tmp_path: Path) -> None:
    gpu = exl3.ArmRunner("patched", tmp_path, tmp_path, dry_run=False).env()
    assert gpu.get("EXL3_FUSED_SAMPLER", "1") != "0"
    request = exl3.request_for("spec-round", "patched", {"options": {}}, False)
    assert "sampler" not in request  # exl3_probe.py picks upstream's fused temperature sampler on the GPU
    embed = exl3.request_for("spec-round", "patched", {"options": {"--embed_on_device": None}}, False)
    assert (
        embed["embed"] == "device"
        and exl3.request_for("spec-round", "flag_off", None, False)["embed"] == "host"
    )
