#!/usr/bin/env python3
"""Device check for the SGLang series: micro-benchmark each GPU-relevant patch against stock, write JSON.

Runs on a machine with an NVIDIA GPU and no network (see docs/engines/sglang.md, "Device check"). Both arms are
SGLang trees (a folder holding ``sglang/``, or a wheel to unzip): the stock 0.5.23 wheel and the wheel
``overlay apply sglang`` builds. Every benchmark loads its functions from each arm in turn (``sys.modules`` is
purged between arms), runs the same inputs through both, and records, per patch:

    {"patch": "0005", "name": ..., "status": "ok" | "skipped" | "failed", "reason": ...,
     "equal": bool | null, "max_err": float | null, "stock_us": float, "patched_us": float, "ratio": stock/patched,
     "graph_replay_equal": bool | null, ...}

Times are medians of CUDA-event timings over ``--iters`` runs after warm-up (host wall time for host-side
patches). Patches whose effect needs several GPUs (0009, 0014, 0015) are reported as skipped on one GPU.

``--dry-run`` runs every benchmark on the CPU with tiny shapes (Triton kernels through ``TRITON_INTERPRET=1``) so
the harness logic, the imports and the JSON are exercised without a GPU; its timings mean nothing.

Usage::

    python3 scripts/device/sglang_check.py --stock build/cache/sglang/sglang-0.5.23-...whl \\
        --patched build/wheels/sglang/sglang-0.5.23+ovl.N.gHASH-...whl --out $OUT/sglang_check.json
    python3 scripts/device/sglang_check.py --stock DIR --patched DIR --dry-run --out /tmp/check.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


# --- arms ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    name: str
    root: Path  # a folder holding the sglang package


def unpack(source: Path, into: Path) -> Path:
    """A folder holding ``sglang/``: ``source`` itself, or the wheel ``source`` unzipped under ``into``."""
    if source.is_dir():
        if not (source / "sglang").is_dir():
            raise SystemExit(f"error: {source} holds no sglang/ folder; pass an SGLang wheel or its unpacked tree")
        return source
    if not zipfile.is_zipfile(source):
        raise SystemExit(f"error: {source} is neither a folder nor a wheel; pass the stock or the patched wheel")
    with zipfile.ZipFile(source) as wheel:
        members = [m for m in wheel.namelist() if m.startswith("sglang/")]
        wheel.extractall(into, members)
    return into


@contextlib.contextmanager
def arm_imports(arm: Arm, env: dict[str, str]) -> Iterator[Callable[[str], Any]]:
    """Import from ``arm`` only: its root first on sys.path, every ``sglang`` module purged before and after."""

    def purge() -> None:
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]

    purge()
    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sys.path.insert(0, str(arm.root))
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(str(arm.root))
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        purge()


# --- timing -------------------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    torch: Any
    device: str
    dry_run: bool
    iters: int

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def time_us(self, fn: Callable[[], Any]) -> float:
        """Median microseconds of ``fn`` (CUDA events on a GPU, perf_counter on the CPU)."""
        torch = self.torch
        for _ in range(3 if self.dry_run else 10):
            fn()
        samples = []
        for _ in range(self.iters):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1000.0)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)

    def host_us(self, fn: Callable[[], Any]) -> float:
        """Median host microseconds of ``fn`` (what a CPU-side patch saves), device synchronized outside."""
        for _ in range(3):
            fn()
        samples = []
        for _ in range(self.iters):
            if self.cuda:
                self.torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        if self.cuda:
            self.torch.cuda.synchronize()
        return statistics.median(samples)

    def graph_replay_equal(self, fn: Callable[[], Any], inputs_update: Callable[[], None]) -> bool | None:
        """Capture ``fn`` in a CUDA graph, change the inputs in place, replay, compare with an eager run."""
        if not self.cuda:
            return None
        torch = self.torch
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fn()
        inputs_update()
        graph.replay()
        torch.cuda.synchronize()
        eager = fn()
        return all(bool(torch.equal(a, b)) for a, b in zip(_flat(captured), _flat(eager)))


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _flat(item)]
    return [x]


# --- benchmarks -----------------------------------------------------------------------------------------------


@dataclass
class Result:
    patch: str
    name: str
    status: str = "ok"
    reason: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"patch": self.patch, "name": self.name, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        out.update(self.data)
        stock, patched = out.get("stock_us"), out.get("patched_us")
        if isinstance(stock, (int, float)) and isinstance(patched, (int, float)) and patched > 0:
            out["ratio"] = round(stock / patched, 4)
        return out


BENCHES: list[tuple[str, str, Callable[..., dict[str, Any]]]] = []


def bench(patch: str, name: str) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]]:
    def register(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        BENCHES.append((patch, name, fn))
        return fn

    return register


class Skip(Exception):
    pass


@bench("0002", "pinned decode-lens staging (host us per step)")
def b_pinned(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch
    cur = list(range(100, 100 + 1))
    nxt = [c + 4 for c in cur]
    with arm_imports(patched, {}) as imp:
        staging = imp("sglang.srt.speculative.eagle_utils").HostLensStaging()

        def new() -> Any:
            a = torch.tensor(cur, dtype=torch.int32)
            b = torch.tensor(nxt, dtype=torch.int32)
            return staging.stage(a, b, ctx.device)

        patched_us = ctx.host_us(new)
        got = [t.cpu().tolist() for t in new()]

    def old() -> Any:
        a = torch.tensor(cur, dtype=torch.int32).to(device=ctx.device, non_blocking=True)
        b = torch.tensor(nxt, dtype=torch.int32).to(device=ctx.device, non_blocking=True)
        return a, b

    stock_us = ctx.host_us(old)
    return {"stock_us": stock_us, "patched_us": patched_us, "equal": got == [cur, nxt]}


def _chain(torch: Any, bs: int, n: int, device: str) -> tuple[Any, Any, Any, Any, Any]:
    g = torch.Generator().manual_seed(0)
    target = torch.randint(0, 1000, (bs, n), generator=g)
    cand = torch.randint(0, 1000, (bs, n), generator=g)
    for b in range(bs):
        keep = int(torch.randint(0, n, (1,), generator=g))
        cand[b, 1 : keep + 1] = target[b, :keep]
    node = torch.arange(n)
    ridx = torch.arange(bs).unsqueeze(1) * n + node
    nxt = torch.where(node < n - 1, node + 1, -1).expand(bs, n).contiguous()
    sib = torch.full((bs, n), -1, dtype=torch.long)
    return tuple(t.to(device) for t in (cand, target, ridx, nxt, sib))  # type: ignore[return-value]


@bench("0005", "greedy chain verify (tensor ops vs tree-walk kernel)")
def b_chain_verify(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch
    bs, n = 1, 4
    cand, target, ridx, nxt, sib = _chain(torch, bs, n, ctx.device)

    def run_stock(imp: Callable[[str], Any]) -> Any:
        st = imp("sglang.kernels.ops.speculative.spec_tree")
        predict = torch.zeros(bs * n, dtype=torch.int32, device=ctx.device)
        acc = torch.full((bs, n), -1, dtype=torch.int32, device=ctx.device)
        num = torch.empty(bs, dtype=torch.int32, device=ctx.device)
        fn = st.verify_tree_greedy_func if ctx.cuda else st.verify_tree_greedy_triton
        fn(predict, acc, num, cand, ridx, nxt, sib, target)
        return predict, acc, num

    with arm_imports(stock, {}) as imp:
        ref = run_stock(imp)
        stock_us = ctx.time_us(lambda: run_stock(imp))
    with arm_imports(patched, {}) as imp:
        fn = imp("sglang.srt.speculative.eagle_utils").verify_chain_greedy
        got = fn(cand, target, ridx, n)
        patched_us = ctx.time_us(lambda: fn(cand, target, ridx, n))

        def update() -> None:
            target.copy_(torch.roll(target, 1, dims=1))

        replay = ctx.graph_replay_equal(lambda: fn(cand, target, ridx, n), update)
    equal = all(bool(torch.equal(a.cpu(), b.cpu())) for a, b in zip(ref, got))
    return {"stock_us": stock_us, "patched_us": patched_us, "equal": equal, "graph_replay_equal": replay}


@bench("0019", "greedy verify tail in the verify graph (argmax + chain accept)")
def b_graph_verify(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch
    n, bs = 4, 1
    vocab = 512 if ctx.dry_run else 151552
    logits = torch.randn(bs * n, vocab, device=ctx.device)
    input_ids = torch.randint(0, vocab, (bs * n,), device=ctx.device)
    node = torch.arange(n, device=ctx.device)
    ridx = torch.arange(bs, device=ctx.device).unsqueeze(1) * n + node
    nxt = torch.where(node < n - 1, node + 1, -1).expand(bs, n).contiguous()
    sib = torch.full((bs, n), -1, dtype=torch.long, device=ctx.device)

    def eager_tail(imp: Callable[[str], Any]) -> Any:
        st = imp("sglang.kernels.ops.speculative.spec_tree")
        target = torch.argmax(logits, -1).view(bs, n)
        predict = torch.zeros(bs * n, dtype=torch.int32, device=ctx.device)
        acc = torch.full((bs, n), -1, dtype=torch.int32, device=ctx.device)
        num = torch.empty(bs, dtype=torch.int32, device=ctx.device)
        fn = st.verify_tree_greedy_func if ctx.cuda else st.verify_tree_greedy_triton
        fn(predict, acc, num, input_ids.view(bs, n), ridx, nxt, sib, target)
        return predict, acc, num

    with arm_imports(stock, {}) as imp:
        ref = [t.cpu() for t in eager_tail(imp)]
        stock_us = ctx.time_us(lambda: eager_tail(imp))
    with arm_imports(patched, {}) as imp:
        epi = imp("sglang.srt.speculative.eagle_utils").ChainGreedyVerifyEpilogue(n, bs, ctx.device)

        def tail() -> Any:
            epi.compute(logits, input_ids, bs, n)
            return epi.buffers(n)[:3]

        tail()
        got = [t.cpu() for t in epi.outputs(bs, n)]
        replay = ctx.graph_replay_equal(tail, lambda: logits.normal_())
        if ctx.cuda:  # the step's cost once captured: a graph replay of the tail
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                tail()
            patched_us = ctx.time_us(graph.replay)
        else:
            patched_us = ctx.time_us(tail)
    equal = all(bool(torch.equal(a, b)) for a, b in zip(ref, got))
    return {"stock_us": stock_us, "patched_us": patched_us, "equal": equal, "graph_replay_equal": replay,
            "note": "stock: eager argmax + tree-walk kernel; patched: the same work replayed inside a graph"}


@bench("0006", "topk==1 chain tree (closed form vs tree kernel)")
def b_chain_tree(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch
    bs, steps = 1, 3
    n = steps + 1
    dev = ctx.device
    seq = torch.tensor([1000] * bs, device=dev)
    parent = torch.tensor([-1] + list(range(steps - 1)), device=dev).expand(bs, -1).contiguous()
    sel = torch.arange(steps, device=dev).expand(bs, steps).contiguous()
    bonus = torch.zeros(bs, dtype=torch.long, device=dev)
    drafts = torch.ones(bs, steps, dtype=torch.long, device=dev)
    args = (bonus, parent, sel, drafts, seq, int(seq.sum()), 1, steps, n)
    flag = {"SGLANG_OPT_CHAIN_TREE": "1"}
    results = {}
    for arm, env in ((stock, {}), (patched, flag)):
        with arm_imports(arm, env) as imp:
            eu = imp("sglang.srt.speculative.eagle_utils")
            mode = eu.TreeMaskMode.FULL_MASK
            if not ctx.cuda:  # the CPU build uses the test backend; run upstream's Triton kernel instead
                st = imp("sglang.kernels.ops.speculative.spec_tree")

                def build() -> Any:
                    mask = torch.full((int(seq.sum()) * n + n * n * bs,), True)
                    r = torch.full((3, bs, n), -1, dtype=torch.long)
                    pos = torch.empty(bs * n, dtype=torch.long)
                    if arm is patched:  # noqa: B023
                        eu.build_chain_tree(seq, mask, pos, r[0], r[1], r[2], n, mode)  # noqa: B023
                    else:
                        st.sgl_build_tree_kernel_triton(parent, sel, seq, mask, pos, r[0], r[1], r[2], 1, steps,  # noqa: B023
                                                        n, mode)  # noqa: B023
                    return mask, pos, r
            else:

                def build() -> Any:
                    return eu.build_tree_kernel_efficient(*args, tree_mask_mode=mode)  # noqa: B023

            results[arm.name] = ([t.cpu() for t in _flat(build())], ctx.time_us(build))
    equal = all(bool(torch.equal(a, b)) for a, b in zip(results["stock"][0], results["patched"][0]))
    return {"stock_us": results["stock"][1], "patched_us": results["patched"][1], "equal": equal}


@bench("0004", "topk==1 draft selection in-graph vs eager")
def b_topk1(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch
    vocab = 512 if ctx.dry_run else 151552
    logits = torch.randn(1, vocab, device=ctx.device)

    def eager() -> Any:
        index = torch.argmax(logits, dim=-1, keepdim=True)
        return torch.ones_like(index, dtype=torch.float32), index

    stock_us = ctx.time_us(eager)
    with arm_imports(patched, {}) as imp:
        fn = imp("sglang.srt.speculative.eagle_utils").draft_topk1_select
        equal = all(bool(torch.equal(a, b)) for a, b in zip(fn(logits), eager()))
        replay = ctx.graph_replay_equal(lambda: fn(logits), lambda: logits.normal_())
        patched_us = ctx.time_us(lambda: fn(logits))
    return {"stock_us": stock_us, "patched_us": patched_us, "equal": equal, "graph_replay_equal": replay,
            "note": "the saving is the eager launch after replay; in-graph cost is part of the replay"}


@bench("0007", "temperature folded into softmax")
def b_softmax(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch
    vocab = 4096 if ctx.dry_run else 151552
    rows = 4
    logits = torch.randn(rows, vocab, device=ctx.device) * 4
    temps = torch.full((rows, 1), 0.7, device=ctx.device)
    with arm_imports(stock, {}) as imp:
        sm = imp("sglang.kernels.ops.sampling").softmax

        def old() -> Any:
            x = logits.clone()
            x.div_(temps)
            return sm(x)

        ref = old()
        stock_us = ctx.time_us(old)
    with arm_imports(patched, {"SGLANG_OPT_FUSED_TEMPERATURE_SOFTMAX": "1"}) as imp:
        sm = imp("sglang.kernels.ops.sampling").softmax

        def new() -> Any:
            return sm(logits.clone(), temperatures=temps)

        got = new()
        patched_us = ctx.time_us(new)
    err = float(((got - ref).abs() / ref.clamp_min(1e-30)).max())
    return {"stock_us": stock_us, "patched_us": patched_us, "max_err": err, "equal": bool(torch.equal(got, ref))}


@bench("0008", "verify sampling params: repeat_interleave x3 vs cache hit (host us)")
def b_params(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch

    class Info:
        temperatures = torch.full((1, 1), 0.7, device=ctx.device)
        top_ks = torch.full((1,), 20, dtype=torch.int32, device=ctx.device)
        top_ps = torch.full((1,), 0.9, device=ctx.device)
        need_top_k_sampling = True
        need_top_p_sampling = True

    info = Info()

    def old() -> Any:
        return [torch.repeat_interleave(t, 4, dim=0) for t in (info.temperatures, info.top_ks, info.top_ps)]

    stock_us = ctx.host_us(old)
    with arm_imports(patched, {"SGLANG_OPT_CACHE_VERIFY_SAMPLING_PARAMS": "1"}) as imp:
        fn = imp("sglang.srt.speculative.eagle_utils").expand_verify_sampling_params
        equal = all(bool(torch.equal(a, b)) for a, b in zip(fn(info, 4), old()))
        patched_us = ctx.host_us(lambda: fn(info, 4))
    return {"stock_us": stock_us, "patched_us": patched_us, "equal": equal}


@bench("0010", "sampling after top-k/top-p: multinomial vs exponential race")
def b_gumbel(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch
    vocab = 4096 if ctx.dry_run else 151552
    probs = torch.softmax(torch.randn(1, vocab, device=ctx.device), -1)
    ks = torch.full((1,), 50, dtype=torch.int32, device=ctx.device)
    ps = torch.full((1,), 0.9, device=ctx.device)
    mins = torch.zeros(1, device=ctx.device)
    pos = torch.zeros(1, dtype=torch.long, device=ctx.device)
    out = {}
    for arm, flag in ((stock, "0"), (patched, "1")):
        with arm_imports(arm, {"SGLANG_OPT_GUMBEL_TOPK_TOPP_SAMPLE": flag}) as imp:
            fn = imp("sglang.srt.layers.sampler").top_k_top_p_min_p_sampling_from_probs_torch
            out[arm.name] = ctx.host_us(lambda: fn(probs.clone(), ks, ps, mins, False, None, pos))  # noqa: B023
    return {"stock_us": out["stock"], "patched_us": out["patched"],
            "note": "host time per call incl. launch; multinomial's bookkeeping is the host cost removed"}


def _block_fp8(torch: Any, n: int, k: int, device: str) -> tuple[Any, Any]:
    g = torch.Generator(device="cpu").manual_seed(1)
    w = torch.randn(n, k, generator=g) * 0.05
    ws = torch.rand(n // 128, k // 128, generator=g) * 0.01 + 0.001
    wq = (w / ws.repeat_interleave(128, 0).repeat_interleave(128, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    return wq.to(device), ws.to(device)


@bench("0013", "split-K small-M block-FP8 GEMM with fused activation quant")
def b_splitk(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch
    shapes = [(256, 512)] if ctx.dry_run else [(2112, 7168), (7168, 2048), (4096, 7168), (24576, 1536)]
    rows = [1, 3] if ctx.dry_run else [1, 4, 8, 16]
    table = []
    for n, k in shapes:
        wq, ws = _block_fp8(torch, n, k, ctx.device)
        for m in rows:
            x = torch.randn(m, k, device=ctx.device).to(torch.bfloat16)
            entry: dict[str, Any] = {"m": m, "n": n, "k": k}
            with arm_imports(stock, {}) as imp:
                fu = imp("sglang.srt.layers.quantization.fp8_utils")
                if ctx.cuda:
                    ref = fu.triton_w8a8_block_fp8_linear(x, wq, [128, 128], ws)
                    entry["stock_us"] = ctx.time_us(lambda: fu.triton_w8a8_block_fp8_linear(x, wq, [128, 128], ws))  # noqa: B023
                else:
                    ref = None  # the stock Triton GEMM needs a GPU config; the torch reference stands in
            with arm_imports(patched, {}) as imp:
                sk = imp("sglang.kernels.ops.gemm.splitk_fp8")
                kernel = sk.splitk_w8a8_block_fp8_linear if ctx.cuda else sk.splitk_w8a8_block_fp8_linear_torch
                got = kernel(x, wq, [128, 128], ws)
                entry["patched_us"] = ctx.time_us(lambda: kernel(x, wq, [128, 128], ws))  # noqa: B023
                torch_ref = sk.splitk_w8a8_block_fp8_linear_torch(x.cpu(), wq.cpu(), [128, 128], ws.cpu())
            base = ref.float().cpu() if ref is not None else torch_ref.float()
            entry["max_abs_err"] = float((got.float().cpu() - base).abs().max())
            entry["ref_max_abs"] = float(base.abs().max())
            if "stock_us" in entry:
                entry["ratio"] = round(entry["stock_us"] / entry["patched_us"], 4)
            table.append(entry)
    return {"cases": table}


@bench("0012", "FP8 lm_head vs BF16 lm_head")
def b_lm_head(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    torch = ctx.torch
    vocab, hidden = (512, 64) if ctx.dry_run else (151552, 6144)
    dtype = torch.float32 if ctx.dry_run else torch.bfloat16
    weight = (torch.randn(vocab, hidden, device=ctx.device) * 0.02).to(dtype)
    table = []
    with arm_imports(patched, {}) as imp:
        f = imp("sglang.srt.layers.quantization.fp8_lm_head")
        head = torch.nn.Module()
        head.weight = torch.nn.Parameter(weight, requires_grad=False)
        copy = f.prepare_fp8_lm_head(head)  # what ModelRunner.initialize does at load
        for m in ([1, 4] if ctx.dry_run else [1, 4, 8]):
            h = torch.randn(m, hidden, device=ctx.device).to(dtype)
            ref = torch.matmul(h, weight.T)
            got = f.fp8_lm_head_logits(h, copy, out_dtype=dtype)
            table.append({
                "m": m,
                "stock_us": ctx.time_us(lambda: torch.matmul(h, weight.T)),  # noqa: B023
                "patched_us": ctx.time_us(lambda: f.fp8_lm_head_logits(h, copy, out_dtype=dtype)),  # noqa: B023
                "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
                "scaled_mm": bool(f._use_scaled_mm(h, copy.qweight)),
            })
    for entry in table:
        entry["ratio"] = round(entry["stock_us"] / entry["patched_us"], 4)
    return {"cases": table}


@bench("0009", "packed verify broadcast (needs >= 2 GPUs)")
def b_broadcast(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    if not ctx.cuda or ctx.torch.cuda.device_count() < 2:
        raise Skip("one GPU: the saving is one NCCL round instead of three; checked for equality on CPU (gloo)")
    raise Skip("multi-GPU run not prepared in this script version")


@bench("0014", "AR + residual + RMSNorm + group FP8 quant (needs >= 2 SM100 GPUs)")
def b_ar_quant(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    raise Skip("needs >= 2 SM100 GPUs with FlashInfer's TRT-LLM all-reduce workspace")


@bench("0015", "CuteDSL AR fusion on the NextN layer (needs an MNNVL Blackwell node)")
def b_nextn(ctx: Ctx, stock: Arm, patched: Arm) -> dict[str, Any]:
    raise Skip("needs several Blackwell GPUs with MNNVL and a GLM-5/DeepSeek MTP checkpoint")


# --- driver -------------------------------------------------------------------------------------------------------


def run(*, stock: Arm, patched: Arm, dry_run: bool, iters: int, only: set[str] | None) -> dict[str, Any]:
    import torch

    device = "cuda" if (torch.cuda.is_available() and not dry_run) else "cpu"
    if not dry_run and device != "cuda":
        raise SystemExit("error: no CUDA device visible; run on the GPU machine, or pass --dry-run to test the harness")
    ctx = Ctx(torch=torch, device=device, dry_run=dry_run, iters=iters)
    results = []
    for patch, name, fn in BENCHES:
        if only and patch not in only:
            continue
        result = Result(patch=patch, name=name)
        try:
            result.data = fn(ctx, stock, patched)
        except Skip as skip:
            result.status, result.reason = "skipped", str(skip)
        except Exception as exc:  # one broken benchmark must not hide the others
            result.status = "failed"
            result.reason = f"{type(exc).__name__}: {exc}"
            result.data = {"traceback": traceback.format_exc()[-3000:]}
        results.append(result.to_json())
        print(f"sglang_check: {patch} {result.status}: {name}", file=sys.stderr, flush=True)
    info: dict[str, Any] = {"torch": torch.__version__, "device": device, "dry_run": dry_run, "iters": iters}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return {"version": SCHEMA_VERSION, "engine": "sglang", "machine": info, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stock", type=Path, required=True, help="stock SGLang wheel or unpacked tree")
    parser.add_argument("--patched", type=Path, required=True, help="patched SGLang wheel or unpacked tree")
    parser.add_argument("--out", type=Path, default=Path("sglang_check.json"), help="JSON report (atomic write)")
    parser.add_argument("--iters", type=int, default=50, help="timed repetitions per measurement (median)")
    parser.add_argument("--only", default="", help="comma-separated patch numbers, e.g. 0005,0013")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreter: harness only")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    with tempfile.TemporaryDirectory(prefix="sglang-check-") as tmp:
        stock = Arm("stock", unpack(args.stock, Path(tmp) / "stock"))
        patched = Arm("patched", unpack(args.patched, Path(tmp) / "patched"))
        report = run(stock=stock, patched=patched, dry_run=args.dry_run, iters=max(1, args.iters),
                     only={p.strip() for p in args.only.split(",") if p.strip()} or None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, args.out)
    failed = [r["patch"] for r in report["results"] if r["status"] == "failed"]
    print(f"sglang_check: wrote {args.out} ({len(report['results'])} results, failed: {failed or 'none'})",
          file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
