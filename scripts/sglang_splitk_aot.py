"""Compile SGLang 0012's split-K FP8 Triton kernel ahead of time for sm_90 and sm_100 on a machine without a GPU.

Usage (any interpreter with triton 3.7, e.g. the SGLang arm of the tests):
    build/venvs/sglang-arm-<patched>/bin/python scripts/sglang_splitk_aot.py > build/reports/sglang-splitk-aot.json

Triton lowers the kernel for a GPUTarget and runs its bundled ptxas; the bundled cuobjdump reads the cubin. Per
target and per decode shape (the split count the launcher picks for that N x K on a 132-SM H200 / 148-SM B200)
the JSON lists registers, stack (spill) bytes, shared memory, the MMA instructions in the PTX, and SASS counts of
HMMA/GMMA (warpgroup MMA), LDGSTS (cp.async) and STL/LDL (local-memory spill traffic). Nothing runs on a GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SIGNATURE = {
    "x_ptr": "*bf16",
    "w_ptr": "*fp8e4nv",
    "ws_ptr": "*fp32",
    "part_ptr": "*fp32",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "stride_xm": "i32",
    "stride_wn": "i32",
    "stride_wsn": "i32",
    "stride_wsk": "i32",
    "stride_pk": "i32",
    "stride_pm": "i32",
    "num_groups": "i32",
    "fp8_min": "fp32",
    "fp8_max": "fp32",
    "eps": "fp32",
    "GROUPS_PER_SPLIT": "constexpr",
    "BLOCK_M": "constexpr",
    "BLOCK_N": "constexpr",
    "BLOCK_K": "constexpr",
}
# (name, N, K) of GLM/DeepSeek-style block-FP8 projections at batch 1
SHAPES = [
    ("q_a_proj+kv_a (2112 x 7168)", 2112, 7168),
    ("o_proj (7168 x 16384)", 7168, 16384),
    ("shared expert down (7168 x 2048)", 7168, 2048),
]
TARGETS = {90: 132, 100: 148}  # compute capability -> SMs (H200, B200)


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_one(sk: Any, cc: int, groups_per_split: int) -> dict[str, Any]:
    consts = {"GROUPS_PER_SPLIT": groups_per_split, "BLOCK_M": sk.MAX_M, "BLOCK_N": 64, "BLOCK_K": sk.GROUP}
    kernel = triton.compile(
        ASTSource(fn=sk._splitk_w8a8_block_fp8_kernel, signature=SIGNATURE, constexprs=consts),
        target=GPUTarget("cuda", cc, 64),
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(kernel.asm["cubin"])
        usage = subprocess.run(
            [_tool("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run(
            [_tool("cuobjdump"), "-sass", path], capture_output=True, text=True, check=True
        ).stdout
    res = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    ptx = kernel.asm["ptx"]
    return {
        "regs": int(res.get("REG", -1)),
        "stack_bytes": int(res.get("STACK", -1)),
        "dynamic_shared_bytes": kernel.metadata.shared,
        "num_warps": kernel.metadata.num_warps,
        "ptx_mma": sorted(
            {ln.split()[0] for ln in ptx.splitlines() if re.match(r"\s*(mma|wgmma|tcgen05)", ln)}
        ),
        "sass_hmma": sass.count("HMMA"),
        "sass_gmma": sass.count("GMMA"),
        "sass_ldgsts": sass.count("LDGSTS"),
        "sass_stl": len(re.findall(r"\bSTL\b", sass)),
        "sass_ldl": len(re.findall(r"\bLDL\b", sass)),
    }


def main(argv: list[str]) -> int:
    if argv:
        sys.path.insert(0, argv[0])  # a folder holding the patched `sglang` package
    from sglang.kernels.ops.gemm import splitk_fp8 as sk

    out: dict[str, Any] = {"version": 1, "triton": triton.__version__, "targets": {}}
    for cc, sms in TARGETS.items():
        rows = []
        for name, n, k in SHAPES:
            groups = triton.cdiv(k, sk.GROUP)
            n_blocks = triton.cdiv(n, 64)
            splits = max(1, min(groups, triton.cdiv(2 * sms, n_blocks)))  # the launcher's _split_count
            gps = triton.cdiv(groups, splits)
            rows.append(
                {
                    "shape": name,
                    "programs": n_blocks * triton.cdiv(groups, gps),
                    "programs_without_split": n_blocks,
                    "groups_per_split": gps,
                    **compile_one(sk, cc, gps),
                }
            )
        out["targets"][f"sm_{cc}"] = {"sms": sms, "shapes": rows}
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
