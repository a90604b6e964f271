"""Unit probe for the SGLang series: run named cases in one arm, print one JSON document.

Runs inside a stock or patched arm (CPU, ``SGLANG_USE_CPU_ENGINE=1``, the test backend on ``PYTHONPATH``).
Payload: ``{"cases": ["chain_verify", ...]}``. For every case the output holds::

    {"ref": <result of the stock code path, computed with the arm's own SGLang>,
     "new": <result of the patched code path on the same inputs, or null where the arm lacks it>,
     ...case-specific extras}

so a test compares ``stock["ref"]`` with ``patched["ref"]`` (flag off: the patch is a no-op) and ``stock["ref"]``
with ``patched["new"]`` (the patch's numerics class). Inputs come from fixed seeds, so both arms see the same
tensors. Triton kernels of upstream run through the Triton interpreter (``TRITON_INTERPRET=1``) on CPU tensors, so
"stock" can be the real upstream kernel where SGLang has a Triton version of it.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import contextlib
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

CASES: dict[str, Callable[[], dict[str, Any]]] = {}


def case(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    CASES[fn.__name__.removeprefix("case_")] = fn
    return fn


@contextlib.contextmanager
def flags(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def optional(module: str, name: str) -> Any:
    """``module.name`` if this arm's SGLang has it, else None (stock lacks what a patch adds)."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def tl(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [tl(v) for v in x]
    if isinstance(x, dict):
        return {k: tl(v) for k, v in x.items()}
    return x


# --- h2d-sync ---------------------------------------------------------------------------------------------------


@case
def case_pinned_lens() -> dict[str, Any]:
    staging_cls = optional("sglang.srt.speculative.eagle_utils", "HostLensStaging")
    g = torch.Generator().manual_seed(1)
    steps = []
    for n in [1, 1, 3, 8, 1, 70, 2, 5, 5, 1, 130, 1]:
        cur = torch.randint(1, 4000, (n,), generator=g).tolist()
        nxt = [c + int(torch.randint(1, 9, (1,), generator=g)) for c in cur]
        steps.append((cur, nxt))
    ref, new = [], []
    staging = staging_cls(depth=3, min_width=4) if staging_cls is not None else None
    for cur, nxt in steps:
        cur_cpu = torch.tensor(cur, dtype=torch.int32, device="cpu")
        nxt_cpu = torch.tensor(nxt, dtype=torch.int32, device="cpu")
        # the stock copies (device == cpu here)
        ref.append([tl(cur_cpu.to(device="cpu", non_blocking=True)), tl(nxt_cpu.to(device="cpu", non_blocking=True))])
        if staging is not None:
            a, b = staging.stage(cur_cpu, nxt_cpu, "cpu")
            new.append([tl(a), tl(b), str(a.dtype), str(b.dtype)])
    # results of earlier steps must survive later stagings (ring reuse must not alias them)
    return {"ref": [r + ["torch.int32", "torch.int32"] for r in ref], "new": new or None}


@case
def case_pp_tail() -> dict[str, Any]:
    fn = optional("sglang.srt.speculative.eagle_worker_v2", "pp_tail_host_seq_lens")
    seq = torch.tensor([17, 3, 250, 9], dtype=torch.int64)
    stock_cpu = seq.to("cpu")
    ref = {"cpu": tl(stock_cpu), "sum": int(stock_cpu.sum())}
    if fn is None:
        return {"ref": ref, "new": None}
    out: dict[str, Any] = {}
    for flag in ("0", "1"):
        for needs in (True, False):
            with flags(SGLANG_OPT_PP_TAIL_GPU_ONLY_LENS=flag):
                cpu, total = fn(seq, needs)
            out[f"flag{flag}_needs{int(needs)}"] = None if cpu is None else {"cpu": tl(cpu), "sum": total}
    return {"ref": ref, "new": out}


@case
def case_stream_ordered_gate() -> dict[str, Any]:
    import itertools

    fn = optional("sglang.srt.managers.overlap_utils", "use_stream_ordered_seq_lens")
    combos = list(itertools.product([False, True], repeat=3))
    # the stock inline scheduler gate: _is_hip and no confidence relay and not needs_cpu_seq_lens
    ref = {f"{h}{c}{n}": h and not c and not n for h, c, n in combos}
    if fn is None:
        return {"ref": ref, "new": None}
    out = {}
    for flag in ("0", "1"):
        with flags(SGLANG_OPT_STREAM_ORDERED_SEQ_LENS=flag):
            out[flag] = {
                f"{h}{c}{n}": fn(is_hip=h, confidence_relay=c, needs_cpu_seq_lens=n) for h, c, n in combos
            }
    return {"ref": ref, "new": out}


# --- cuda-graph -------------------------------------------------------------------------------------------------


@case
def case_draft_topk1_select() -> dict[str, Any]:
    fn = optional("sglang.srt.speculative.eagle_utils", "draft_topk1_select")
    g = torch.Generator().manual_seed(2)
    ref, new = [], []
    for bs in (1, 2, 7):
        logits = torch.randint(-3, 4, (bs, 512), generator=g).float()  # many ties
        index = torch.argmax(logits, dim=-1, keepdim=True)
        ref.append([tl(torch.ones_like(index, dtype=torch.float32)), tl(index)])
        if fn is not None:
            p, i = fn(logits)
            new.append([tl(p), tl(i)])
    return {"ref": ref, "new": new or None}


def _chain_inputs(bs: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 50, (bs, n), generator=g)
    candidates = torch.randint(0, 50, (bs, n), generator=g)
    for b in range(bs):
        keep = int(torch.randint(0, n, (1,), generator=g))  # accept this many drafts by construction
        for j in range(1, keep + 1):
            candidates[b, j] = target[b, j - 1]
    return candidates, target


@case
def case_chain_verify() -> dict[str, Any]:
    from sglang.kernels.ops.speculative import spec_tree

    fn = optional("sglang.srt.speculative.eagle_utils", "verify_chain_greedy")
    ref, triton_ref, new = [], [], []
    for bs, n, seed in ((1, 2, 0), (1, 4, 1), (3, 4, 2), (8, 4, 3), (4, 6, 4)):
        candidates, target = _chain_inputs(bs, n, seed)
        node = torch.arange(n)
        retrieve_index = torch.arange(bs).unsqueeze(1) * n + node
        next_token = torch.where(node < n - 1, node + 1, -1).expand(bs, n).contiguous()
        sibling = torch.full((bs, n), -1, dtype=torch.long)
        outs = []
        for impl in (spec_tree.verify_tree_greedy_func, spec_tree.verify_tree_greedy_triton):
            predict = torch.zeros(bs * n, dtype=torch.int32)
            accept_index = torch.full((bs, n), -1, dtype=torch.int32)
            num = torch.empty(bs, dtype=torch.int32)
            impl(
                predict, accept_index, num, candidates, retrieve_index, next_token, sibling, target
            )
            outs.append(tl([predict, accept_index, num]))
        ref.append(outs[0])
        triton_ref.append(outs[1])
        if fn is not None:
            new.append(tl(list(fn(candidates, target, retrieve_index, n))))
    return {"ref": ref, "triton_ref": triton_ref, "new": new or None}


@case
def case_chain_tree() -> dict[str, Any]:
    from sglang.kernels.ops.speculative import spec_tree
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

    eagle_utils = __import__("sglang.srt.speculative.eagle_utils", fromlist=["x"])
    ref, triton_ref, new = [], [], []
    g = torch.Generator().manual_seed(5)
    for bs, steps in ((1, 1), (1, 3), (3, 3), (6, 2)):
        n = steps + 1
        seq_lens = torch.randint(1, 40, (bs,), generator=g)
        parent_list = torch.tensor([-1] + list(range(steps - 1)) if steps > 1 else [], dtype=torch.long)
        parent_list = parent_list.expand(bs, -1).contiguous() if steps > 1 else torch.empty(bs, 0, dtype=torch.long)
        top_scores_index = torch.arange(steps).expand(bs, steps).contiguous()
        bonus = torch.randint(0, 100, (bs,), generator=g)
        drafts = torch.randint(0, 100, (bs, steps), generator=g)
        for mode in (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY):
            args = (bonus, parent_list, top_scores_index, drafts, seq_lens, int(seq_lens.sum()), 1, steps, n)
            with flags(SGLANG_OPT_CHAIN_TREE="0"):
                ref.append(tl(list(eagle_utils.build_tree_kernel_efficient(*args, tree_mask_mode=mode))))
            # upstream's Triton tree kernel (the XPU path), through the interpreter
            tree_mask = (
                torch.full((int(seq_lens.sum()) * n + n * n * bs,), True)
                if mode == TreeMaskMode.FULL_MASK
                else torch.full((n * n * bs,), True)
            )
            retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
            positions = torch.empty(bs * n, dtype=torch.long)
            spec_tree.sgl_build_tree_kernel_triton(
                parent_list, top_scores_index, seq_lens, tree_mask, positions, retrieve[0], retrieve[1],
                retrieve[2], 1, steps, n, mode,
            )
            triton_ref.append(
                tl([tree_mask, positions, retrieve[0], retrieve[1], retrieve[2], torch.cat([bonus[:, None], drafts], 1).flatten()])
            )
            if hasattr(eagle_utils, "build_chain_tree"):
                with flags(SGLANG_OPT_CHAIN_TREE="1"):
                    new.append(tl(list(eagle_utils.build_tree_kernel_efficient(*args, tree_mask_mode=mode))))
    return {"ref": ref, "triton_ref": triton_ref, "new": new or None}


@case
def case_graph_verify_epilogue() -> dict[str, Any]:
    from sglang.kernels.ops.speculative import spec_tree

    eu = __import__("sglang.srt.speculative.eagle_utils", fromlist=["x"])
    n, vocab = 4, 512
    g = torch.Generator().manual_seed(13)
    ref, new = [], []
    epilogue = eu.ChainGreedyVerifyEpilogue(n, 8, "cpu") if hasattr(eu, "ChainGreedyVerifyEpilogue") else None
    for graph_bs, bs in ((1, 1), (4, 3), (8, 8)):
        logits = torch.randn(graph_bs * n, vocab, generator=g)
        input_ids = torch.randint(0, vocab, (graph_bs * n,), generator=g)
        target = torch.argmax(logits, -1).view(graph_bs, n)
        for b in range(graph_bs):  # force accepted prefixes of different lengths
            keep = b % n
            input_ids.view(graph_bs, n)[b, 1 : keep + 1] = target[b, :keep]
        # stock eager tail on the first bs rows: argmax + verify_tree_greedy_func
        cand = input_ids[: bs * n].view(bs, n)
        node = torch.arange(n)
        predict = torch.zeros(bs * n, dtype=torch.int32)
        acc = torch.full((bs, n), -1, dtype=torch.int32)
        num = torch.empty(bs, dtype=torch.int32)
        spec_tree.verify_tree_greedy_func(
            predict, acc, num, cand, torch.arange(bs).unsqueeze(1) * n + node,
            torch.where(node < n - 1, node + 1, -1).expand(bs, n).contiguous(), torch.full((bs, n), -1),
            torch.argmax(logits[: bs * n], -1).view(bs, n),
        )
        ref.append(tl([predict, acc, num]))
        if epilogue is not None:
            epilogue.compute(logits, input_ids, graph_bs)  # what the captured graph runs (padded size)
            epilogue.captured_sizes.add(graph_bs)
            new.append(tl(list(epilogue.outputs(bs))))
    extra: dict[str, Any] = {}
    if epilogue is not None:
        extra["ready"] = [epilogue.ready_for(4, 3), epilogue.ready_for(2, 2), epilogue.ready_for(None, 1)]

        class Info:
            is_all_greedy = True
            acc_additive_penalties = None
            acc_scaling_penalties = None
            logit_bias = None
            has_custom_logit_processor = False
            has_watermark_candidates = False

        usable = {"plain": eu.graph_verify_usable(Info(), None, None)}
        for attr, value in (("is_all_greedy", False), ("acc_additive_penalties", torch.zeros(1)),
                            ("acc_scaling_penalties", torch.ones(1)), ("logit_bias", torch.zeros(1)),
                            ("has_custom_logit_processor", True)):
            info = Info()
            setattr(info, attr, value)
            usable[attr] = eu.graph_verify_usable(info, None, None)
        usable["grammar"] = eu.graph_verify_usable(Info(), object(), None)
        wm = Info()
        wm.has_watermark_candidates = True
        usable["watermark"] = eu.graph_verify_usable(wm, None, object())
        extra["usable"] = usable
    return {"ref": ref, "new": new or None, **extra}


# --- sampling-fusion --------------------------------------------------------------------------------------------


@case
def case_temperature_softmax() -> dict[str, Any]:
    from sglang.kernels.ops import sampling
    from sglang.kernels.ops.sampling import temperature_softmax as ts

    g = torch.Generator().manual_seed(6)
    rows, vocab = 3, 32000
    logits = torch.randn(rows, vocab, generator=g) * 4
    temps = torch.tensor([[0.7], [1.0], [1.3]])
    # stock sampler standard path: in-place div, then softmax
    stock_logits = logits.clone()
    stock_logits.div_(temps)
    ref = sampling.softmax(stock_logits)
    # the patched sampler path (flag on) calls softmax(logits, temperatures=...)
    with flags(SGLANG_OPT_FUSED_TEMPERATURE_SOFTMAX="1"):
        via_api = sampling.softmax(logits.clone(), temperatures=temps)
    # upstream's fused Triton kernels, launched as temperature_softmax does on a GPU (interpreter here)
    t = temps.reshape(-1).contiguous()
    block, splits = ts._split_geometry(rows, vocab)
    pmax = torch.empty(rows, splits)
    psum = torch.empty(rows, splits)
    rmax = torch.empty(rows)
    rsum = torch.empty(rows)
    probs = torch.empty_like(logits)
    ts._partial_max_sumexp_kernel[(rows, splits)](logits, t, pmax, psum, logits.stride(0), vocab, splits, BLOCK=block)
    ts._combine_kernel[(rows,)](pmax, psum, rmax, rsum, splits, BLOCK=max(2, 1 << (splits - 1).bit_length()))
    ts._normalize_kernel[(rows, splits)](logits, t, rmax, rsum, probs, logits.stride(0), probs.stride(0), vocab, BLOCK=block)
    rel = ((probs - ref).abs() / ref.clamp_min(1e-30)).max().item()
    return {
        "ref": tl(ref.sum(-1)) + [float(ref.double().square().sum())],
        "api_equal_stock": bool(torch.equal(via_api, ref)),
        "kernel_max_rel_err": rel,
        "kernel_row_sums": tl(probs.sum(-1)),
        "kernel_argmax_equal": bool(torch.equal(probs.argmax(-1), ref.argmax(-1))),
        "splits": splits,
        "new": True,
    }


class _FakeSamplingInfo:
    def __init__(self, temps: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor) -> None:
        self.temperatures = temps
        self.top_ks = top_ks
        self.top_ps = top_ps
        self.need_top_k_sampling = True
        self.need_top_p_sampling = True


@case
def case_verify_probs() -> dict[str, Any]:
    fn = optional("sglang.srt.speculative.eagle_utils", "expand_verify_sampling_params")
    info = _FakeSamplingInfo(
        torch.tensor([[0.7], [1.0], [0.2]]), torch.tensor([5, 1, 40], dtype=torch.int32), torch.tensor([0.9, 1.0, 0.5])
    )
    n = 4
    ref = [tl(torch.repeat_interleave(x, n, dim=0)) for x in (info.temperatures, info.top_ks, info.top_ps)]
    if fn is None:
        return {"ref": ref, "new": None}
    out: dict[str, Any] = {}
    with flags(SGLANG_OPT_CACHE_VERIFY_SAMPLING_PARAMS="0"):
        out["flag_off"] = tl(list(fn(info, n)))
    with flags(SGLANG_OPT_CACHE_VERIFY_SAMPLING_PARAMS="1"):
        first = fn(info, n)
        second = fn(info, n)
        out["flag_on"] = tl(list(first))
        out["cache_hit"] = all(a is b for a, b in zip(first, second))
        info.temperatures.mul_(2.0)  # in-place update must invalidate
        third = fn(info, n)
        out["after_inplace"] = tl(third[0])
        out["inplace_expected"] = tl(torch.repeat_interleave(info.temperatures, n, dim=0))
        info.top_ps = torch.tensor([0.1, 0.2, 0.3])  # replaced tensor must invalidate
        out["after_replace"] = tl(fn(info, n)[2])
        out["replace_expected"] = tl(torch.repeat_interleave(info.top_ps, n, dim=0))
    return {"ref": ref, "new": out}


def _broadcast_worker(rank: int, world: int, store_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=world)

    class Group:
        def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
            dist.broadcast(tensor, src=src)

    mod = __import__("sglang.srt.speculative.eagle_utils", fromlist=["x"])
    packed_modes = (False, True) if hasattr(mod, "broadcast_verify_outputs") else (False,)
    results = {}
    for packed in packed_modes:
        g = torch.Generator().manual_seed(100 + rank)  # ranks disagree before the broadcast
        predict = torch.randint(0, 512, (8,), generator=g, dtype=torch.int32)
        accept_index = torch.randint(-1, 8, (2, 4), generator=g, dtype=torch.int32)
        num = torch.randint(0, 4, (2,), generator=g, dtype=torch.int32)
        if hasattr(mod, "broadcast_verify_outputs"):
            os.environ["SGLANG_OPT_PACKED_VERIFY_BROADCAST"] = "1" if packed else "0"
            mod.broadcast_verify_outputs(Group(), predict, accept_index, num)
        else:  # the stock inline code
            for t in (predict, accept_index, num):
                Group().broadcast(t, src=0)
        results["packed" if packed else "three"] = [predict, accept_index, num]
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@case
def case_packed_broadcast() -> dict[str, Any]:
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as store, tempfile.TemporaryDirectory() as out:
        mp.start_processes(_broadcast_worker, args=(2, store, out), nprocs=2, join=True, start_method="spawn")
        ranks = [torch.load(f"{out}/rank{r}.pt") for r in range(2)]

    def view(mode: str) -> dict[str, Any] | None:
        if mode not in ranks[0]:
            return None
        return {"rank0": tl(ranks[0][mode]), "rank1": tl(ranks[1][mode])}

    return {"ref": view("three"), "new": view("packed")}


@case
def case_gumbel_topk_topp() -> dict[str, Any]:
    from sglang.srt.layers import sampler

    probs = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.08, 0.06, 0.04, 0.03, 0.02, 0.01, 0.005, 0.005])
    draws = 200_000
    rows = probs.expand(draws, -1).contiguous()
    top_ks = torch.full((draws,), 6, dtype=torch.int32)
    top_ps = torch.full((draws,), 0.9)
    min_ps = torch.zeros(draws)
    expected = probs.clone()
    expected[6:] = 0.0
    csum = torch.cumsum(expected, 0)
    expected[(csum - expected) > 0.9] = 0.0
    expected = expected / expected.sum()

    def run(flag: str) -> dict[str, Any]:
        torch.manual_seed(7)
        with flags(SGLANG_OPT_GUMBEL_TOPK_TOPP_SAMPLE=flag):
            ids = sampler.top_k_top_p_min_p_sampling_from_probs_torch(
                rows.clone(), top_ks, top_ps, min_ps, False, None, torch.zeros(draws, dtype=torch.long)
            )
        counts = torch.bincount(ids.long(), minlength=probs.numel()).double()
        support = expected > 0
        exp_counts = expected.double() * draws
        chi2 = float((((counts - exp_counts) ** 2) / exp_counts)[support].sum())
        return {"chi2": chi2, "dof": int(support.sum()) - 1, "outside_support": int(counts[~support].sum()),
                "greedy_ok": True}

    def greedy_check(flag: str) -> bool:
        g = torch.Generator().manual_seed(8)
        p = torch.softmax(torch.randn(64, 100, generator=g), -1)
        with flags(SGLANG_OPT_GUMBEL_TOPK_TOPP_SAMPLE=flag):
            ids = sampler.top_k_top_p_min_p_sampling_from_probs_torch(
                p.clone(), torch.ones(64, dtype=torch.int32), torch.ones(64), torch.zeros(64), False, None,
                torch.zeros(64, dtype=torch.long),
            )
        return bool(torch.equal(ids.long(), p.argmax(-1)))

    ref = run("0")
    ref["greedy_ok"] = greedy_check("0")
    has = optional("sglang.srt.layers.sampler", "exponential_race_sample") is not None
    new = None
    if has:
        new = run("1")
        new["greedy_ok"] = greedy_check("1")
    return {"ref": ref, "new": new}


# --- lm-head ----------------------------------------------------------------------------------------------------


class _Head:
    def __init__(self, weight: torch.Tensor, **attrs: Any) -> None:
        self.weight = weight
        for k, v in attrs.items():
            setattr(self, k, v)


def _method(name: str, **attrs: Any) -> Any:
    cls = type(name, (), {"apply": lambda self, *a, **k: None})
    obj = cls()
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


@case
def case_lm_head_quant_predicate() -> dict[str, Any]:
    import ast
    import inspect

    from sglang.srt.layers import logits_processor as lp

    fp4_attrs = ("weight_scale", "weight_global_scale", "workspace", "input_size_per_partition",
                 "output_size_per_partition")
    w4a16_attrs = ("weight_scale_interleaved", "alpha", "input_size_per_partition", "output_size_per_partition")
    w4a4_attrs = w4a16_attrs + ("input_scale_inv",)
    heads = {
        "bf16": _Head(torch.zeros(2, 2, dtype=torch.bfloat16)),
        "int32_fp4": _Head(torch.zeros(2, 2, dtype=torch.int32), **{a: 1 for a in fp4_attrs}),
        "uint8_w4a16": _Head(torch.zeros(2, 2, dtype=torch.uint8), **{a: 1 for a in w4a16_attrs}),
        "uint8_w4a4": _Head(torch.zeros(2, 2, dtype=torch.uint8), **{a: 1 for a in w4a4_attrs}),
        "fp8_scaled": _Head(torch.zeros(2, 2, dtype=torch.float8_e4m3fn), weight_scale=1, input_scale=1),
        "fp8_bare": _Head(torch.zeros(2, 2, dtype=torch.float8_e4m3fn)),
        "no_weight": object(),
    }
    methods = {
        "none": None,
        "unquant": _method("UnquantizedEmbeddingMethod"),
        "fp4_w4a16": _method("ModelOptFp4LinearMethod", quant_mode="w4a16"),
        "fp4_w4a4": _method("ModelOptFp4LinearMethod", quant_mode="w4a4"),
        "nvfp4a16": _method("ModelOptNvFp4A16LinearMethod"),
        "fp8": _method("ModelOptFp8LinearMethod"),
        "other": _method("SomeOtherLinearMethod"),
    }
    table = {
        f"{h}/{m}": bool(lp.should_apply_lm_head_quant_method(head, method))
        for h, head in heads.items()
        for m, method in methods.items()
    }
    tree = ast.parse(inspect.getsource(lp))
    defs = sum(isinstance(n, ast.FunctionDef) and n.name == "should_apply_lm_head_quant_method" for n in tree.body)
    return {"ref": table, "definitions": defs, "new": True}


@case
def case_fp8_lm_head() -> dict[str, Any]:
    from safetensors.torch import load_file

    mod = optional("sglang.srt.layers.quantization.fp8_lm_head", "fp8_lm_head_logits")
    model_dir = os.environ.get("OVERLAY_SGLANG_MODEL_DIR")
    g = torch.Generator().manual_seed(9)
    if model_dir:
        weights = load_file(os.path.join(model_dir, "model.safetensors"))
        weight = weights.get("lm_head.weight", weights.get("model.embed_tokens.weight")).float()
    else:
        weight = torch.randn(512, 64, generator=g) * 0.05
    hidden = torch.randn(256, weight.shape[1], generator=g)
    ref = torch.matmul(hidden.to(weight.dtype), weight.T)  # the stock normal lm_head path
    out: dict[str, Any] = {"ref": {"shape": list(ref.shape), "dtype": str(ref.dtype)}, "new": None}
    if mod is None:
        return out
    from sglang.srt.layers.quantization import fp8_lm_head as f

    before = weight.clone()
    logits = f.fp8_lm_head_logits(hidden, weight)
    q, s = f.fp8_lm_head_weight(weight)
    deq = q.float() * s
    # E4M3 rounds to 3 mantissa bits: at most 16 / 448 of the row's max |w| (half a step at the top binade)
    per_elem = ((deq - weight).abs() / (s * f.FP8_MAX).clamp_min(1e-30)).max().item()
    span = (ref.max(-1).values - ref.min(-1).values).clamp_min(1e-30)
    rel = ((logits.float() - ref).abs().max(-1).values / span).max().item()
    top1 = (logits.argmax(-1) == ref.argmax(-1)).float().mean().item()
    # a second module holding the same tensor (shared MTP head / tied embedding) reuses the copy
    q2, _ = f.fp8_lm_head_weight(weight)
    out["new"] = {
        "shape": list(logits.shape),
        "dtype": str(logits.dtype),
        "weight_err_rel_row_max": per_elem,
        "logit_err_rel_span": rel,
        "top1_agreement": top1,
        "shared_copy": q2 is q,
        "weight_unchanged": bool(torch.equal(before, weight)),
        "real_weight": bool(model_dir),
    }
    return out


# --- kernel-injection ---------------------------------------------------------------------------------------------


@case
def case_splitk_fp8_gemm() -> dict[str, Any]:
    from sglang.kernels.ops.quantization import fp8_kernel

    g = torch.Generator().manual_seed(10)
    m, n, k = 3, 256, 640  # K = 5 groups: uneven splits
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g) * 0.05
    ws = torch.rand(n // 128, k // 128, generator=g) * 0.01 + 0.001
    wq = (w / ws.repeat_interleave(128, 0).repeat_interleave(128, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    # stock math: the per-token-group quant formula of fp8_kernel (s = max(|x|, eps) / fp8_max; q = x * (1 / s)),
    # in torch (Triton's interpreter mis-rounds fp32 -> e4m3), then the block-scaled GEMM in float64
    xf = x.float().view(m, -1, 128)
    s_x = xf.abs().amax(-1).clamp_min(1e-10) / fp8_kernel.fp8_max
    q_x = (xf * (1.0 / s_x).unsqueeze(-1)).clamp(fp8_kernel.fp8_min, fp8_kernel.fp8_max).to(torch.float8_e4m3fn)
    deq_x = (q_x.double() * s_x.double().unsqueeze(-1)).view(m, k)
    deq_w = wq.double() * ws.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    exact = deq_x @ deq_w.T
    ref = {"shape": [m, n], "fp8_max": float(fp8_kernel.fp8_max)}
    torch_ref = optional("sglang.kernels.ops.gemm.splitk_fp8", "splitk_w8a8_block_fp8_linear_torch")
    if torch_ref is None:
        return {"ref": ref, "new": None}
    from sglang.kernels.ops.gemm import splitk_fp8
    from sglang.kernels.selector import select_kernel
    from sglang.kernels.spec import KernelBackend

    results = {}
    for splits in (1, 2, 5):
        out = torch_ref(x, wq, [128, 128], ws, split_k=splits)
        ulp = (exact.abs() * 2.0**-8).clamp_min(1e-6)
        results[str(splits)] = {
            "max_err_in_bf16_ulps": float(((out.double() - exact).abs() / ulp).max()),
            "dtype": str(out.dtype),
        }
    # the router sends small-M calls to the registered kernel and the rest to the default linear
    calls: list[str] = []

    def default(*a: Any, **kw: Any) -> torch.Tensor:
        calls.append("default")
        return torch.zeros(a[0].shape[0], a[1].shape[0], dtype=a[0].dtype)

    routed = splitk_fp8.small_m_splitk_router(default)
    small = routed(x, wq, [128, 128], ws, None, None)
    routed(torch.randn(32, k).to(torch.bfloat16), wq, [128, 128], ws, None, None)
    spec_triton = select_kernel("gemm.splitk_w8a8_block_fp8_linear", KernelBackend.TRITON)
    spec_torch = select_kernel("gemm.splitk_w8a8_block_fp8_linear", KernelBackend.TORCH)
    return {
        "ref": ref,
        "new": {
            "splits": results,
            "router_calls": calls,
            "router_small_equal_torch_ref": bool(torch.equal(small, torch_ref(x, wq, [128, 128], ws))),
            "registered": [spec_triton.target, spec_torch.target],
        },
    }


# --- allreduce-fusion -------------------------------------------------------------------------------------------


@case
def case_fused_norm_quant() -> dict[str, Any]:
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.quantization import fp8_utils

    g = torch.Generator().manual_seed(11)
    m, h, ranks = 5, 512, 2
    partials = [torch.randn(m, h, generator=g).to(torch.bfloat16) for _ in range(ranks)]
    residual = torch.randn(m, h, generator=g).to(torch.bfloat16)
    norm = RMSNorm(h, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_((torch.rand(h, generator=g) + 0.5).to(norm.weight.dtype))
    # stock unfused chain: all-reduce (sum) then the native fused add + RMSNorm
    summed = torch.stack([p.float() for p in partials]).sum(0).to(torch.bfloat16)
    ref_norm, ref_res = norm.forward_native(summed.clone(), residual.clone())
    ref = {"norm": tl(ref_norm.float()), "residual": tl(ref_res.float())}
    fn = optional("sglang.srt.layers.flashinfer_comm_fusion", "ar_residual_rmsnorm_group_quant_reference")
    if fn is None:
        return {"ref": ref, "new": None}
    norm_out, q, scale, packed, res_out = fn(partials, residual, norm.weight.data, 1e-6, 128)
    deq = (q.float().view(m, -1, 128) * scale.unsqueeze(-1)).view(m, h)
    amax = norm_out.float().view(m, -1, 128).abs().amax(-1)
    log2 = torch.log2(scale)
    # unpack the int32 words: byte j of word i is the biased exponent of group 4i + j
    words = packed.to(torch.int64) & 0xFFFFFFFF
    exps = torch.stack([(words >> (8 * j)) & 0xFF for j in range(4)], -1).view(m, -1)[:, : scale.shape[1]]

    class _Cuda:  # the stock DeepGEMM packed-layout validator checks .is_cuda
        def __init__(self, t: torch.Tensor) -> None:
            self._t = t

        def __getattr__(self, name: str) -> Any:
            return True if name == "is_cuda" else getattr(self._t, name)

    weight = torch.zeros(64, h, dtype=torch.float8_e4m3fn)
    layout_ok = fp8_utils._deepgemm_packed_input_valid(_Cuda(q), weight, packed, torch.zeros(1, 4))
    return {
        "ref": ref,
        "new": {
            "norm": tl(norm_out.float()),
            "residual": tl(res_out.float()),
            "dequant_max_rel_err": float(((deq - norm_out.float()).abs() / amax.repeat_interleave(128, 1)).max()),
            "scales_pow2": bool(torch.equal(log2, log2.round())),
            "scales_cover_max": bool((amax / scale <= 448.0).all()),
            "packed_exponents_ok": bool(torch.equal(exps, log2.round().to(torch.int64) + 127)),
            "deepgemm_layout_ok": bool(layout_ok),
        },
    }


@case
def case_nextn_ar_fusion() -> dict[str, Any]:
    import itertools

    fn = optional("sglang.srt.models.deepseek_v2", "layer_uses_cutedsl_fusion")
    combos = list(itertools.product([False, True], repeat=3))
    # the stock inline gate: not enable_prefill_cp and not is_nextn and _use_mnnvl_cutedsl_fusion()
    ref = {f"{a}{b}{c}": (not b) and (not a) and c for a, b, c in combos}
    if fn is None:
        return {"ref": ref, "new": None}
    out = {}
    for flag in ("0", "1"):
        with flags(SGLANG_OPT_NEXTN_AR_FUSION=flag):
            out[flag] = {
                f"{a}{b}{c}": fn(is_nextn=a, enable_prefill_cp=b, cutedsl_available=c) for a, b, c in combos
            }
    return {"ref": ref, "new": out}


# --- mtp --------------------------------------------------------------------------------------------------------


@case
def case_cpu_sampling_verify() -> dict[str, Any]:
    from sglang.srt.speculative import eagle_utils as eu

    fn = getattr(eu, "tree_speculative_sampling_target_only_torch", None)
    g = torch.Generator().manual_seed(12)
    vocab, n = 16, 4
    # stock pytorch sampler masks (top-k / top-p) for the renorm comparison
    probs = torch.softmax(torch.randn(6, vocab, generator=g), -1)
    top_ks = torch.tensor([1, 3, 5, 16, 2, 8], dtype=torch.int32)
    top_ps = torch.tensor([1.0, 0.9, 0.5, 0.3, 1.0, 0.8])
    ref_mask_k = []
    ref_mask_p = []
    sorted_p, idx = probs.sort(-1, descending=True)
    for r in range(6):
        mk = torch.zeros(vocab, dtype=torch.bool)
        mk[idx[r, : int(top_ks[r])]] = True
        ref_mask_k.append(tl(mk))
        before = torch.cumsum(sorted_p[r], 0) - sorted_p[r]
        mp = torch.zeros(vocab, dtype=torch.bool)
        mp[idx[r][before <= top_ps[r]]] = True  # the stock pytorch sampler keeps these (probs_sum - p <= top_p)
        ref_mask_p.append(tl(mp))
    ref = {"mask_k": ref_mask_k, "mask_p": ref_mask_p}
    if fn is None:
        return {"ref": ref, "new": None}
    new: dict[str, Any] = {
        "mask_k": tl(eu.top_k_renorm_prob_torch(probs, top_ks) > 0),
        "mask_p": tl(eu.top_p_renorm_prob_torch(probs, top_ps) > 0),
    }
    # lossless check: the first committed token of a chain verify is distributed as the target at the root
    target_root = torch.softmax(torch.randn(vocab, generator=g), -1)
    trials = 9000
    counts = torch.zeros(vocab)
    never_zero = True
    for t in range(trials):
        target = torch.softmax(torch.randn(n, vocab, generator=g), -1)
        target[0] = target_root
        drafts = torch.randint(0, vocab, (1, n), generator=g)
        if t % 10 == 0:
            target[0, drafts[0, 1]] = 0.0  # a draft with no target mass must never be accepted
            target[0] /= target[0].sum()
        predicts = torch.zeros(n, dtype=torch.int32)
        accept_index = torch.full((1, n), -1, dtype=torch.int32)
        num = torch.zeros(1, dtype=torch.int32)
        node = torch.arange(n)
        fn(
            predicts=predicts, accept_index=accept_index, accept_token_num=num, candidates=drafts,
            retrive_index=node.view(1, n), retrive_next_token=torch.where(node < n - 1, node + 1, -1).view(1, n),
            retrive_next_sibling=torch.full((1, n), -1), uniform_samples=torch.rand(1, n, generator=g),
            uniform_samples_for_final_sampling=torch.rand(1, generator=g), target_probs=target.view(1, n, vocab),
            draft_probs=torch.zeros(1, n, vocab), threshold_single=1.0, threshold_acc=1.0,
        )
        first = int(predicts[0])  # token committed after the root: accepted draft 1 or the residual draw
        if t % 10 == 0:
            if int(num[0]) > 0 and first == int(drafts[0, 1]):
                never_zero = False
        else:
            counts[first] += 1
    # every 10th trial perturbs the root distribution; the chi-square uses the others
    expected = target_root * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected.clamp_min(1e-9)).sum())
    new.update({"chi2": chi2, "dof": vocab - 1, "never_accepts_zero_mass": never_zero})
    return {"ref": ref, "new": new}


@case
def case_accept_stats() -> dict[str, Any]:
    mod = optional("sglang.srt.speculative.acceptance_stats", "SpecAcceptanceStats")
    if mod is None:
        return {"ref": None, "new": None}
    from sglang.srt.speculative import acceptance_stats as a

    buckets = {str(t): a.temperature_bucket(t) for t in (0.0, 0.3, 0.5, 0.7, 1.0, 1.5)}
    buckets["topk1"] = a.temperature_bucket(0.8, top_k=1)
    stats = a.SpecAcceptanceStats()
    for n in (0, 3, 3, 1):
        stats.record(1.0, -1, {"workload": "chat"}, n)
    stats.record(1.0, 1, None, 2)
    return {"ref": None, "new": {"buckets": buckets, "snapshot": stats.snapshot(),
                                 "labels": [a.workload_label(None), a.workload_label({"workload": "x" * 40})]}}


def main() -> int:
    payload = json.load(sys.stdin)
    out: dict[str, Any] = {"version": 1, "cases": {}}
    for name in payload["cases"]:
        try:
            out["cases"][name] = CASES[name]()
        except Exception:  # noqa: BLE001 - reported per case so one failure does not hide the others
            out["cases"][name] = {"error": traceback.format_exc()[-3000:]}
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
