"""Probe: the fused multi-token tier's bound (BC_GatedMLP / BC_BlockSparseMLP run_bszN): statics handed to the bound
class, which token counts take the fused path, and the constants shared by the Python and C++ sides.

GatedMLP.load_local and GatedMLP.forward are the wheel's own, run on a stand-in module object (linears that record
their calls, a recording bound class in place of the extension's BC_GatedMLP, statics on the meta device). The C++
constants are read from the extension sources the installed wheel ships.

payload: {"env": {...}} or {"cases": [...]}
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from _common import run_cases


def gated_mlp_object(
    config: Any, gates: list[Any], ups: list[Any], downs: list[Any], *, hidden: int, activation_fn_call: Any
) -> Any:
    """A stand-in GatedMLP object (one slice, silu, fp16, statics on the meta device, the wheel's MAX_BSZN) on which
    the wheel's own GatedMLP.load_local / forward run; also the ExLlamaV3 census's verify-mlp module."""
    from exllamav3.modules import mlp

    return SimpleNamespace(
        config=config,
        gates=gates,
        ups=ups,
        downs=downs,
        num_slices=1,
        interm_div=1.0,
        hidden_size=hidden,
        interm_dtype=torch.half,
        activation_fn="silu",
        act_limit=0.0,
        multi_gu=[None],
        tp_reduce=False,
        out_dtype=torch.half,
        bszn=mlp.MAX_BSZN,
        device=torch.device("meta"),
        activation_fn_call=activation_fn_call,
    )


def _define(text: str, name: str, defines: list[str] | None = None) -> int | None:
    """The integer a macro of a header expands to, under the build's -D defines: a small preprocessor for the
    #ifdef / #ifndef / #else / #endif / #define NAME VALUE lines (VALUE a number or another macro)"""
    macros: dict[str, str] = {}
    value: str | None
    for d in defines or []:
        key, _, value = d[2:].partition("=")
        macros[key] = value or "1"
    active = [True]
    for line in text.splitlines():
        words = line.split()
        if not words or not words[0].startswith("#"):
            continue
        if words[0] in ("#ifdef", "#ifndef"):
            active.append(active[-1] and ((words[1] in macros) == (words[0] == "#ifdef")))
        elif words[0] == "#else":
            active[-1] = not active[-1] and active[-2]
        elif words[0] == "#endif":
            active.pop()
        elif words[0] == "#define" and active[-1] and len(words) >= 3:
            macros[words[1]] = words[2]
    value = macros.get(name)
    while value is not None and not value.isdigit():
        value = macros.get(value)
    return int(value) if value is not None else None


def case(payload: dict[str, Any]) -> dict[str, Any]:
    import exllamav3
    import exllamav3.ext as ext_mod
    from exllamav3.modules import block_sparse_mlp, mlp
    from exllamav3.util import cuda_flags

    standin = ext_mod.exllamav3_ext
    recorded: dict[str, Any] = {}

    class RecordingBC:
        def __init__(self, guh: Any, gu: Any, a: Any, down_xh: Any, *rest: Any) -> None:
            recorded["statics"] = [list(t.shape) for t in (guh, gu, a, down_xh)]
            self.calls: list[int] = []

        def run_bszN(self, x: Any, d: Any) -> None:
            self.calls.append(int(x.shape[1]))

    standin.BC_GatedMLP = RecordingBC

    class RecLinear:
        def __init__(self, name: str) -> None:
            self.name = name
            self.quant_type = "exl3"
            self.out_features = 256
            self.inner = SimpleNamespace(K=4, bias=None, mul1=False, bc=f"{name}-bc")
            self.calls: list[int] = []

        def forward(self, x: Any, params: Any) -> Any:
            self.calls.append(int(x.shape[0] * x.shape[1]))
            return torch.zeros(x.shape[:-1] + (256,), dtype=torch.half)

    fake = gated_mlp_object(
        SimpleNamespace(infer_params=SimpleNamespace(no_reconstruct=False, use_mgemm=lambda *a: False)),
        [RecLinear("gate")],
        [RecLinear("up")],
        [RecLinear("down")],
        hidden=128,
        activation_fn_call=lambda g, u, a, limit: None,
    )
    out: dict[str, Any] = {}
    try:
        mlp.GatedMLP.load_local(fake, torch.device("meta"), 0)
    except ValueError as e:
        return {"error": str(e)}
    out["statics"] = recorded.get("statics")

    fused = []
    for tokens in range(1, 18):
        fake.bc.calls.clear()
        mlp.GatedMLP.forward(fake, torch.zeros((1, tokens, 128), dtype=torch.half), {})
        fused.append(bool(fake.bc.calls))
    out["fused_tokens"] = [t for t, f in zip(range(1, 18), fused) if f]

    # MoE tier sizing (patched: fused_tier_rows; stock: MAX_BSZN x top-k)
    rows = getattr(block_sparse_mlp, "fused_tier_rows", None)
    out["moe_tier"] = {
        k: list(rows(k)) if rows else [block_sparse_mlp.MAX_BSZN * k, block_sparse_mlp.MAX_BSZN]
        for k in (1, 6, 8, 16, 32)
    }

    # Python <-> C++ constants of the installed wheel
    src = Path(exllamav3.__file__).parent / "exllamav3_ext"
    mlp_h = (src / "libtorch" / "mlp.h").read_text()
    kernel = (src / "quant" / "exl3_moe_coop_kernel.cuh").read_text()
    slots = re.search(r"constexpr int MAX_SLOTS = (\d+);", kernel)
    out["constants"] = {
        # as the extension build compiles it: ext.py adds util/cuda_flags.py ovl_build_defines() (patched)
        "cpp_max_bszn": _define(mlp_h, "MAX_BSZN", getattr(cuda_flags, "ovl_build_defines", list)()),
        "build_defines": getattr(cuda_flags, "ovl_build_defines", list)(),
        "py_max_bszn": mlp.MAX_BSZN,
        "py_moe_max_bszn": block_sparse_mlp.MAX_BSZN,
        "py_caps": list(getattr(mlp, "FUSED_ROWS_CAPS", [mlp.MAX_BSZN])),
        "cpp_max_slots": int(slots.group(1)) if slots else None,
        "py_max_slots": getattr(block_sparse_mlp, "MOE_COOP_MAX_SLOTS", None),
        "split_ref_tokens": _define(
            (src / "quant" / "exl3_moe_coop.cuh").read_text(), "MOE_COOP_SPLIT_REF_TOKENS"
        ),
    }
    return out


if __name__ == "__main__":
    run_cases(case)
