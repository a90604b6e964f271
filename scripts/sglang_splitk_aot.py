"""Compile SGLang 0007's split-K FP8 Triton kernels and the stock block-FP8 GEMM they replace ahead of time, for sm_90
and sm_100, on a machine without a GPU.

Usage (any interpreter with triton 3.7, e.g. the SGLang arm of the tests; the argument is a folder holding the patched
``sglang`` package, e.g. the unpacked patched wheel or ``build/worktrees/sglang/python`` after ``overlay checkout``):
    build/venvs/sglang-arm-<patched>/bin/python scripts/sglang_splitk_aot.py TREE > build/reports/sglang-splitk-aot.json

Triton lowers each kernel for a GPUTarget and runs its bundled ptxas; the bundled cuobjdump reads the cubin. Per target
and per decode shape (M = 1):
- ``splitk``: the split-K kernel at the split count its launcher picks for that N x K on a 132-SM H200 / 148-SM B200
  (``DIRECT`` when that count is 1: the kernel stores the output itself), and ``reduce``, the reduce+cast kernel the
  launcher adds when it splits;
- ``stock``: what ``dispatch_w8a8_block_fp8_linear`` runs by default where DeepGEMM is absent,
  ``w8a8_block_fp8_matmul_triton``'s ``_w8a8_block_fp8_matmul``, with the config SGLang 0.5.23 ships for that N x K on
  an H200 (sm_90) / B200 (sm_100) at M = 1 (kernels/ops/gemm/configs), else its default config (noted).
Each row: registers, stack (spill) bytes, shared memory, warps and stages, programs (grid), the MMA instructions in the
PTX (``mma.sync`` = Ampere-style warp MMA; ``wgmma`` = Hopper warpgroup MMA; ``tcgen05`` = Blackwell tensor-memory MMA),
and SASS counts of HMMA / QMMA (warp MMA, bf16 / fp8), GMMA (warpgroup MMA), UTCMMA / UTC*MMA (tcgen05), LDGSTS
(cp.async), UTMALDG (TMA loads) and STL/LDL (local-memory spill traffic). Nothing runs on a GPU; DeepGEMM (the
default on H100/H200 when installed) is a CUDA library and is not compiled here.
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

SPLITK_SIGNATURE = {
    "x_ptr": "*bf16",
    "w_ptr": "*fp8e4nv",
    "ws_ptr": "*fp32",
    "part_ptr": "*fp32",
    "out_ptr": "*bf16",
    "bias_ptr": "*bf16",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "stride_xm": "i32",
    "stride_wn": "i32",
    "stride_wsn": "i32",
    "stride_wsk": "i32",
    "stride_pk": "i32",
    "stride_pm": "i32",
    "stride_om": "i32",
    "num_groups": "i32",
    "fp8_min": "fp32",
    "fp8_max": "fp32",
    "eps": "fp32",
    "GROUPS_PER_SPLIT": "constexpr",
    "BLOCK_M": "constexpr",
    "BLOCK_N": "constexpr",
    "BLOCK_K": "constexpr",
    "HAS_BIAS": "constexpr",
    "DIRECT": "constexpr",
}
REDUCE_SIGNATURE = {
    "part_ptr": "*fp32",
    "bias_ptr": "*bf16",
    "out_ptr": "*bf16",
    "MN": "i32",
    "N": "i32",
    "SPLITS": "i32",
    "stride_pk": "i32",
    "stride_pm": "i32",
    "stride_om": "i32",
    "HAS_BIAS": "constexpr",
    "BLOCK": "constexpr",
}
STOCK_SIGNATURE = {
    "A": "*fp8e4nv",
    "B": "*fp8e4nv",
    "C": "*bf16",
    "As": "*fp32",
    "Bs": "*fp32",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "group_n": "i32",
    "group_k": "i32",
    **dict.fromkeys(
        (
            "stride_am",
            "stride_ak",
            "stride_bk",
            "stride_bn",
            "stride_cm",
            "stride_cn",
            "stride_As_m",
            "stride_As_k",
            "stride_Bs_k",
            "stride_Bs_n",
        ),
        "i32",
    ),
    "BLOCK_SIZE_M": "constexpr",
    "BLOCK_SIZE_N": "constexpr",
    "BLOCK_SIZE_K": "constexpr",
    "GROUP_SIZE_M": "constexpr",
    "needs_masking": "constexpr",
}
# (name, N, K) of GLM/DeepSeek-style block-FP8 projections at batch 1
SHAPES = [
    ("q_a_proj+kv_a (2112 x 7168)", 2112, 7168),
    ("o_proj (7168 x 16384)", 7168, 16384),
    ("shared expert down (7168 x 2048)", 7168, 2048),
]
TARGETS = {
    90: (132, "NVIDIA_H200"),
    100: (148, "NVIDIA_B200"),
}  # compute capability -> SMs, config device name
M = 1
STOCK_DEFAULT = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": 128,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 32,
    "num_warps": 4,
    "num_stages": 3,
}  # w8a8_block_fp8_matmul_triton's default (block [128, 128])


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_one(
    fn: Any, signature: dict[str, str], consts: dict[str, Any], cc: int, *, warps: int = 4, stages: int = 3
) -> dict[str, Any]:
    kernel = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=consts),
        target=GPUTarget("cuda", cc, 64),
        options={"num_warps": warps, "num_stages": stages},
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
        "shared_bytes": kernel.metadata.shared,
        "num_warps": kernel.metadata.num_warps,
        "num_stages": stages,
        "ptx_mma": sorted(set(re.findall(r"\b(?:wgmma\.mma_async|tcgen05\.mma|mma\.sync)[\w.:]*", ptx))),
        "sass_hmma": len(re.findall(r"\bHMMA\b", sass)),
        "sass_qmma": len(re.findall(r"\bQMMA\b", sass)),
        "sass_gmma": len(re.findall(r"\b[HQ]?GMMA\b", sass)),
        "sass_utcmma": len(re.findall(r"\bUTC\w*MMA\b", sass)),
        "sass_ldgsts": len(re.findall(r"\bLDGSTS\b", sass)),
        "sass_utmaldg": len(re.findall(r"\bUTMALDG\b", sass)),
        "sass_stl": len(re.findall(r"\bSTL\b", sass)),
        "sass_ldl": len(re.findall(r"\bLDL\b", sass)),
    }


def stock_config(configs_dir: str, device: str, n: int, k: int) -> tuple[dict[str, Any], str]:
    name = f"N={n},K={k},device_name={device},dtype=fp8_w8a8,block_shape=[128, 128].json"
    path = os.path.join(configs_dir, name)
    if not os.path.exists(path):
        return dict(STOCK_DEFAULT), f"default config (no {device} config for N={n}, K={k})"
    with open(path) as fh:
        table = {int(key): val for key, val in json.load(fh).items()}
    key = min(table, key=lambda x: abs(x - M))
    return dict(table[key]), f"{device} config, M key {key}"


def main(argv: list[str]) -> int:
    if argv:
        sys.path.insert(0, argv[0])  # a folder holding the patched `sglang` package
    from sglang.kernels.ops.gemm import fp8_kernel as stock
    from sglang.kernels.ops.gemm import splitk_fp8 as sk

    configs_dir = os.path.join(os.path.dirname(stock.__file__), "configs")
    out: dict[str, Any] = {"version": 2, "triton": triton.__version__, "m": M, "targets": {}}
    for cc, (sms, device) in TARGETS.items():
        rows = []
        for name, n, k in SHAPES:
            groups = triton.cdiv(k, sk.GROUP)
            n_blocks = triton.cdiv(n, 64)
            splits = max(1, min(groups, triton.cdiv(2 * sms, n_blocks)))  # the launcher's _split_count
            gps = triton.cdiv(groups, splits)
            splits = triton.cdiv(groups, gps)
            consts = {
                "GROUPS_PER_SPLIT": gps,
                "BLOCK_M": sk.MAX_M,
                "BLOCK_N": 64,
                "BLOCK_K": sk.GROUP,
                "HAS_BIAS": False,
                "DIRECT": splits == 1,
            }
            split_row = {
                "programs": n_blocks * splits,
                "splits": splits,
                "groups_per_split": gps,
                **compile_one(sk._splitk_w8a8_block_fp8_kernel, SPLITK_SIGNATURE, consts, cc),
            }
            reduce_row = None
            if splits > 1:
                reduce_row = {
                    "programs": triton.cdiv(M * n, sk.REDUCE_BLOCK),
                    **compile_one(
                        sk._splitk_reduce_kernel,
                        REDUCE_SIGNATURE,
                        {"HAS_BIAS": False, "BLOCK": sk.REDUCE_BLOCK},
                        cc,
                    ),
                }
            cfg, source = stock_config(configs_dir, device, n, k)
            warps, stages = cfg.pop("num_warps", 4), cfg.pop("num_stages", 3)
            extra = sorted(set(cfg) - {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M"})
            stock_consts = {
                key: cfg[key] for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")
            }
            stock_row = {
                "config": source
                + (f"; also {extra} (a split-K / swap-AB config: the Hopper kernel)" if extra else ""),
                "block": [
                    stock_consts["BLOCK_SIZE_M"],
                    stock_consts["BLOCK_SIZE_N"],
                    stock_consts["BLOCK_SIZE_K"],
                ],
                "programs": triton.cdiv(M, stock_consts["BLOCK_SIZE_M"])
                * triton.cdiv(n, stock_consts["BLOCK_SIZE_N"]),
                **compile_one(
                    stock._w8a8_block_fp8_matmul,
                    STOCK_SIGNATURE,
                    {**stock_consts, "needs_masking": k % stock_consts["BLOCK_SIZE_K"] != 0},
                    cc,
                    warps=warps,
                    stages=stages,
                ),
            }
            rows.append(
                {"shape": name, "n": n, "k": k, "splitk": split_row, "reduce": reduce_row, "stock": stock_row}
            )
        out["targets"][f"sm_{cc}"] = {"sms": sms, "config_device": device, "shapes": rows}
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
