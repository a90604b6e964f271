"""ExLlamaV3 census scenario ``verify-mlp`` (called by exllamav3_census.py's ``census()``; runs inside an exllamav3 arm
with the labelled stand-in extension): the target's gated MLP over one verify forward's rows.

What runs: the wheel's own ``GatedMLP.load_local`` (which picks the fused gate/up MGEMM, sizes the bound class's
statics and, with patch 0015, reads ``EXL3_OVL_BSZN`` through ``mlp.fused_rows_cap``) and ``GatedMLP.forward`` (which
routes ``bsz * q_len`` rows to the bound class's graphed multi-token path ``BC_GatedMLP.run_bszN`` or to the eager
per-linear path), and under it the wheel's ``Linear.forward`` and ``LinearEXL3.forward`` for the eager path's linears.
One census step is one forward of one MLP layer over ``rows`` rows (bsz 2 x (K + 1): 16 rows at K 7; a model's verify
forward runs it once per layer), after WARMUP steps.

What is stood in (the same in every arm): the module object (a namespace holding the attributes the two methods read:
hidden 128, intermediate 256, silu, fp16 intermediates; statics on the meta device), its linears' EXL3 tensors
(``LinearEXL3`` objects whose bound class ``BC_LinearEXL3.run_alloc`` is one launch returning an empty device tensor),
the fused gate/up ``MultiLinear`` (its pointer tables), the extension's kernels (``exl3_mgemm``, ``silu_mul``: one
call = one eager launch, no work) and the bound class ``BC_GatedMLP``, modelled on libtorch/mlp.cpp: its statics'
token width is its bound (checked against the compiled capacity MAX_BSZN, read from the wheel's libtorch/mlp.h under
the build defines of the wheel's ``util/cuda_flags.ovl_build_defines`` where it has one: the extension this arm's
environment would build), and its ``run_bszN`` per token count runs eagerly once, then captures, then replays the
graph; a graph replay counts the kernels ``run_bszN_gr`` puts in the graph (MGEMM, activation, down GEMM: 3; gate and
up GEMMs separately: 4; bias adds: none here) as graph-launches, and no eager launch.

Request fields read here: "steps", "rows" (default 16; 1..32), "gate_up" ("mgemm", default: what ``use_mgemm`` picks
for EXL3 tensors without the mul1 codebook; "separate": gate and up as two GEMMs, the int8-GEMV configuration).
The MoE tier (``BC_BlockSparseMLP.run_bszN``) is not run: not measured.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace
from typing import Any

from census_sites import census_record, judged_flags

SCENARIO, TAG = "verify-mlp", "mlp"
ROWS = 16  # the census's verify forward: bsz 2 x (K 7 + 1)
HIDDEN, INTERM = 128, 256
WARMUP = 2  # the bound class's first call per token count runs eagerly, the second captures its graph
FLAG_PREFIX = "EXL3_OVL_"
GATE_UP = ("mgemm", "separate")
STANDIN = (
    "the MLP module object, its linears' EXL3 tensors (BC_LinearEXL3.run_alloc: one launch), the fused gate/up "
    "MultiLinear's tables, the extension's kernels (one call = one eager launch, no work) and the bound class "
    "BC_GatedMLP (modelled on libtorch/mlp.cpp: eager first call, then capture, then one graph replay per call, "
    "counted as the kernels its graph holds, as graph-launches); GatedMLP.load_local / forward, Linear.forward and "
    "LinearEXL3.forward are the wheel's"
)
NOT_COUNTED = {
    "collectives": "no tensor-parallel path runs on CPU",
    "cache-hits": "no engine cache entry point is wrapped by the census",
    "capturable": "the bound class's graph is C++ (modelled, not judged); the forward runs eagerly around it",
}


def verify_mlp(request: Any, *, environ: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The census record of ``steps`` MLP forwards over ``rows`` rows; ``environ``: the os.environ class that records
    the EXL3_OVL_* switches the engine reads (exllamav3_census._RecordingEnviron); ``options``: model_init options
    (none is run here)."""
    if options:
        raise SystemExit(
            f"exllamav3 census: verify-mlp runs no model_init option (got {sorted(options)}): the MLP forward does "
            "not involve them"
        )
    for field in ("ring_bits", "bsz"):
        if request.get(field) is not None:
            raise SystemExit(
                f"exllamav3 census: verify-mlp does not take {field}={request.get(field)!r} (give 'rows': bsz x (K + 1))"
            )
    steps, rows = int(request["steps"]), int(request.get("rows", ROWS))
    gate_up = request.get("gate_up", "mgemm")
    if not 1 <= steps <= 64 or not 1 <= rows <= 32 or gate_up not in GATE_UP:
        raise SystemExit(
            f"exllamav3 census: verify-mlp steps {steps} / rows {rows} / gate_up {gate_up!r}: expected 1..64 / "
            f"1..32 / one of {', '.join(GATE_UP)}"
        )

    import _devsim
    import exllamav3
    import exllamav3.ext as ext_mod
    import torch
    from exllamav3.modules import linear as linear_mod
    from exllamav3.modules import mlp
    from exllamav3.modules.quant import exl3 as exl3_mod
    from exllamav3.util import cuda_flags
    from fused_tier import _define, gated_mlp_object
    from torch_census import Census

    standin = ext_mod.exllamav3_ext
    c = Census(placement="is_cuda", device_class=_devsim.CensusDev, skip=(_devsim.__file__,))
    src = os.path.join(os.path.dirname(exllamav3.__file__), "exllamav3_ext", "libtorch", "mlp.h")
    with open(src, encoding="utf-8") as f:
        mlp_h = f.read()
    state: dict[str, Any] = {}

    def launches(n: int, kind: str, graph: bool = False) -> None:
        c.count("graph-launches" if graph else "eager-launches", n, kind=kind, site=f"exllamav3_ext.{kind}")

    class BoundGatedMLP:
        """libtorch/mlp.h BC_GatedMLP: its bound is its statics' token width, at most the compiled MAX_BSZN."""

        def __init__(self, guh: Any, gu: Any, a: Any, down_xh: Any, gu_ptrs_trellis: Any, *rest: Any) -> None:
            # read when the bound class is built: a patched wheel's ovl_build_defines reads EXL3_OVL_BSZN
            defines = list(getattr(cuda_flags, "ovl_build_defines", list)())
            compiled = _define(mlp_h, "MAX_BSZN", defines)
            width = int(guh.shape[1])
            if compiled is None or not 1 <= width <= compiled:
                raise SystemExit(
                    f"exllamav3 census: BC_GatedMLP statics of {width} tokens, compiled MAX_BSZN {compiled} "
                    f"(defines {defines}): the extension refuses them"
                )
            state.update(
                statics=[list(t.shape) for t in (guh, gu, a, down_xh)], compiled=compiled, defines=defines
            )
            self.bszn = width
            self.kernels = (
                3 if gu_ptrs_trellis is not None else 4
            )  # run_bszN_gr: (mgemm | gate + up), act, down
            self.graphs: dict[int, str] = {}

        def run_bszN(self, x: Any, d: Any) -> None:
            tokens = x.numel() // x.shape[-1]
            if not 1 <= tokens <= self.bszn:
                raise RuntimeError("run_bszN: bsz out of supported range")
            state["bszN_calls"] = state.get("bszN_calls", 0) + 1
            phase = self.graphs.get(tokens)
            if phase is None:  # first call: run_bszN_gr without a graph, then ready_to_record
                launches(self.kernels, "BC_GatedMLP.run_bszN:eager")
                self.graphs[tokens] = "ready_to_record"
            else:  # capture (the second call) and launch; later calls launch the captured graph
                launches(self.kernels, "BC_GatedMLP.run_bszN:graph", graph=True)
                self.graphs[tokens] = "ready"

    class BoundLinear:
        """libtorch/linear.cpp BC_LinearEXL3.run_alloc: the output's allocation and one GEMM."""

        def run_alloc(self, x: Any, out_features: int, fp32: bool) -> Any:
            launches(1, "BC_LinearEXL3.run_alloc")
            dtype = torch.float if fp32 else torch.half
            return torch.empty((*x.shape[:-1], out_features), dtype=dtype, device=x.device)

    class StandInMultiLinear:
        def __init__(self, device: Any, linears: list[Any]) -> None:
            self.out_features = linears[0].out_features
            self.K, self.mcg, self.mul1 = linears[0].inner.K, False, False
            self.ptrs_trellis = self.ptrs_suh = self.ptrs_svh = "ptrs"

    infer = SimpleNamespace(no_reconstruct=False, use_mgemm=lambda *a: gate_up == "mgemm")
    config = SimpleNamespace(infer_params=infer)

    def linear(name: str, in_f: int, out_f: int) -> Any:
        inner = exl3_mod.LinearEXL3.__new__(exl3_mod.LinearEXL3)
        inner.__dict__.update(
            key=name, config=config, bc=BoundLinear(), out_features=out_f, in_features=in_f,
            default_out_dtype=torch.half, K=4, bias=None, mul1=False,
        )  # fmt: skip
        outer = SimpleNamespace(
            key=name, quant_type="exl3", inner=inner, in_features=in_f, out_features=out_f,
            out_features_unpadded=out_f, trim_padded_out=False, qmap=None, lora_a_tensors={},
            pre_scale=1.0, softcap=0.0, post_scale=1.0, out_dtype=torch.half,
        )  # fmt: skip
        outer.forward = lambda x, params, out_dtype=None: linear_mod.Linear.forward(
            outer, x, params, out_dtype
        )
        return outer

    module = gated_mlp_object(
        config,
        [linear("gate", HIDDEN, INTERM)],
        [linear("up", HIDDEN, INTERM)],
        [linear("down", INTERM, HIDDEN)],
        hidden=HIDDEN,
        activation_fn_call=standin.silu_mul,  # GatedMLP.__init__'s choice for silu
    )

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    saved = {
        "BC_GatedMLP": standin.BC_GatedMLP,
        "MultiLinear": mlp.MultiLinear,
        "references": dict(standin.REFERENCES),
    }
    standin.BC_GatedMLP = BoundGatedMLP
    mlp.MultiLinear = StandInMultiLinear
    for kernel in ("exl3_mgemm", "silu_mul"):
        standin.REFERENCES[kernel] = nothing
    shape = (2, rows // 2, HIDDEN) if rows % 2 == 0 else (1, rows, HIDDEN)
    x = torch.zeros(shape, dtype=torch.half).as_subclass(_devsim.CensusDev)
    plain_environ = os.environ.__class__
    os.environ.__class__ = environ
    routes: list[str] = []
    try:
        try:
            mlp.GatedMLP.load_local(module, torch.device("meta"), 0)
        except ValueError as e:  # fused_rows_cap refusing EXL3_OVL_BSZN
            raise SystemExit(f"exllamav3 census: verify-mlp: {e}") from e
        if module.bc is None:
            raise SystemExit("exllamav3 census: verify-mlp: GatedMLP.load_local built no bound class")
        with c:
            for _ in range(steps + WARMUP):
                before, bszn_before = standin.calls.copy(), state.get("bszN_calls", 0)
                with c.step(TAG):
                    out = mlp.GatedMLP.forward(module, x, {})
                    for kernel, n in (standin.calls - before).items():
                        launches(n, kernel)
                routes.append("fused" if state.get("bszN_calls", 0) > bszn_before else "eager")
                if tuple(out.shape) != shape:
                    raise SystemExit(
                        f"exllamav3 census: verify-mlp: output {tuple(out.shape)} for input {shape}"
                    )
    finally:
        os.environ.__class__ = plain_environ
        standin.BC_GatedMLP = saved["BC_GatedMLP"]
        mlp.MultiLinear = saved["MultiLinear"]
        standin.REFERENCES.clear()
        standin.REFERENCES.update(saved["references"])
    report = c.report(tag=TAG, skip=WARMUP)
    metrics = dict(report["metrics"])
    for metric in NOT_COUNTED:
        metrics[metric] = None
    fused = routes[-1] == "fused"
    route = (
        "graphed path (BC_GatedMLP.run_bszN: one graph replay per forward, counted as its kernels)"
        if fused
        else "eager path (per-linear kernels)"
    )
    notes = [
        (
            f"one gated MLP layer (hidden {HIDDEN}, intermediate {INTERM}, silu, gate/up {gate_up}) over {rows} rows "
            f"(input {list(shape)}); {report['steps']} steps after {WARMUP} warm-up (the bound class's eager first "
            "call and its capture)"
        ),
        (
            f"bound class statics {state.get('statics')} (token bound {module.bc.bszn}), compiled MAX_BSZN "
            f"{state.get('compiled')} (build defines {state.get('defines') or 'none'}): {rows} rows take the {route}"
        ),
        (
            "peak-memory / alloc-bytes count the forward's temporaries (the eager path's gate/up buffers and "
            "outputs); the bound class's statics are allocated at load (here on the meta device), not counted"
        ),
    ]
    flagged, metrics = judged_flags(
        FLAG_PREFIX, environ.read, "on this scenario's CPU path (GatedMLP.load_local / forward)", metrics
    )
    notes += flagged
    notes.append("the MoE tier (BC_BlockSparseMLP.run_bszN) is not run: not measured")
    notes += [f"{m}: not counted ({why})" for m, why in NOT_COUNTED.items()]
    detail = {
        "rows": rows,
        "gate_up": gate_up,
        "token_bound": module.bc.bszn,
        "compiled_max_bszn": state.get("compiled"),
        "route": "fused" if fused else "eager",
        "routes": routes,
        "statics": state.get("statics"),
    }
    with contextlib.suppress(KeyError):
        detail["violations"] = report["violations"][:5]
    return census_record(SCENARIO, report, metrics, notes, standin=STANDIN, detail=detail, steps=steps)
