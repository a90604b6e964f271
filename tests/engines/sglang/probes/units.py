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

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)

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


def _future_map_resolve(needs_cpu_seq_lens: bool, cuda_layout: bool, steps: int = 3) -> dict[str, Any]:
    """S1: the real FutureMap of the wheel (managers/overlap_utils.py), publish then resolve_seq_lens_cpu, as the
    overlap scheduler calls them once per spec decode step (scheduler.py run_batch), counted by the torch census.
    ``cuda_layout``: FutureMap as its constructor builds it on CUDA (a pinned host mirror and a private D2H stream;
    module flag _is_cuda set, torch.get_device_module answering the census's torch.cuda stand-ins whose
    Stream.synchronize is a counted host wait) - labelled stand-ins for the CUDA runtime only; the FutureMap, its
    buffers and both methods are the wheel's. Without it: the non-CUDA bootstrap path (``.cpu()``)."""
    import types

    sys.path.insert(0, os.path.join(REPO, "src", "overlay", "engines", "workers"))
    from sglang.srt.managers import overlap_utils
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from torch_census import Census

    pool = types.SimpleNamespace(req_to_token=torch.zeros((8, 64), dtype=torch.int32))
    census = Census()
    saved = (overlap_utils._is_cuda, torch.get_device_module)
    reports = []
    with census:
        if cuda_layout:
            overlap_utils._is_cuda = True
            torch.get_device_module = lambda device=None: torch.cuda
        try:
            fm = overlap_utils.FutureMap(
                torch.device("cpu"), SpeculativeAlgorithm.EAGLE, pool, needs_cpu_seq_lens=needs_cpu_seq_lens
            )
            pool_idx = torch.tensor([3, 5], dtype=torch.int64)
            with census.host():
                pool_idx_cpu = torch.tensor([3, 5], dtype=torch.int64)
            for i in range(steps):
                new_lens = torch.tensor([100 + i, 40 + 2 * i], dtype=torch.int64, device="cpu:0")
                batch = types.SimpleNamespace(
                    spec_info=types.SimpleNamespace(future_indices=pool_idx),
                    req_pool_indices_cpu=pool_idx_cpu,
                    seq_lens=None,
                    seq_lens_cpu=None,
                    seq_lens_sum=None,
                )
                fm.publish(pool_idx, new_lens)  # the verify's on_publish (step N)
                with census.step():  # the scheduler's resolve before step N + 1
                    fm.resolve_seq_lens_cpu(batch)
                reports.append(
                    {
                        "seq_lens_cpu": None if batch.seq_lens_cpu is None else tl(batch.seq_lens_cpu),
                        "seq_lens_sum": batch.seq_lens_sum,
                    }
                )
        finally:
            overlap_utils._is_cuda, torch.get_device_module = saved
    report = census.report()
    return {
        "pinned_mirror": fm.new_seq_lens_cpu_pinned is not None,
        "d2h_stream": fm.fwd_prepare_d2h_stream is not None,
        "host_syncs_per_resolve": report["metrics"]["host-syncs"],
        "bytes_moved_per_resolve": report["metrics"]["bytes-moved"],
        "kinds": report["kinds"],
        "sites": report["sites"].get("host-syncs", []),
        "resolved": reports,
    }


@case
def case_future_map_resolve() -> dict[str, Any]:
    """S1 (no patch): stock FutureMap.resolve_seq_lens_cpu's host wait per resolve, in each layout."""
    out = {
        f"{'cuda' if cuda else 'bootstrap'}_needs{int(needs)}": _future_map_resolve(needs, cuda)
        for cuda in (True, False)
        for needs in (True, False)
    }
    return {"ref": out, "new": None}


# --- cuda-graph -------------------------------------------------------------------------------------------------


class _GreedyInfo:
    is_all_greedy = True
    acc_additive_penalties = None
    acc_scaling_penalties = None
    logit_bias = None
    has_custom_logit_processor = False
    has_watermark_candidates = False


class _Launches:
    """Ops that would be kernel launches on a GPU, as the mechanism census counts them (views and allocation-only ops
    excluded; ``verify_tree_greedy_func`` is one kernel on CUDA, so its call counts once and what the CPU stand-in
    does inside is not counted). ``ops``: the op names in order."""

    _NO_KERNEL = {  # noqa: RUF012 (a constant table)
        "detach",
        "lift_fresh",
        "alias",
        "empty",
        "empty_strided",
        "empty_like",
        "new_empty",
        "_local_scalar_dense",
        "set_",
        "resize_",
        "is_nonzero",
        "scalar_tensor",
    }

    def __init__(self, eu: Any) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self
        self.ops: list[str] = []
        self._eu, self._depth = eu, 0

        class Mode(TorchDispatchMode):  # type: ignore[misc]
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                name = func.overloadpacket.__name__
                if not counter._depth and not func.is_view and name not in counter._NO_KERNEL:
                    counter.ops.append(name)
                return func(*args, **(kwargs or {}))

        self._mode = Mode()

    def __enter__(self) -> _Launches:
        stock = self._saved = self._eu.verify_tree_greedy_func

        def one_kernel(*args: Any, **kwargs: Any) -> Any:
            self.ops.append("verify_tree_greedy")
            self._depth += 1
            try:
                return stock(*args, **kwargs)
            finally:
                self._depth -= 1

        self._eu.verify_tree_greedy_func = one_kernel
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        self._eu.verify_tree_greedy_func = self._saved


# 0011 with --speculative-adaptive: the startup target verify graph runner (3 steps: draft width 4) and the runners
# build_adaptive_runtime_state captures for other step counts through the same capture_tail_hooks (2 steps: width 3;
# 5 steps: width 6), each with its own graph batch sizes.
_VERIFY_RUNNERS = {"steps3": (4, (1, 4, 8)), "steps2": (3, (1, 4)), "steps5": (6, (4,))}
# (runner that apply_runtime_state made current, or None for an eager verify; graph bs; real bs)
_VERIFY_STEPS = [
    ("steps3", 1, 1),
    ("steps3", 4, 3),
    ("steps2", 4, 3),
    ("steps5", 4, 2),
    ("steps2", 1, 1),
    ("steps3", 8, 8),
    ("steps5", 4, 4),
    (None, 0, 2),
]


def _verify_step_inputs(
    n: int, graph_bs: int, seed: int, vocab: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(graph_bs * n, vocab, generator=g)
    input_ids = torch.randint(0, vocab, (graph_bs * n,), generator=g)
    target = torch.argmax(logits, -1).view(graph_bs, n)
    for b in range(graph_bs):  # accepted prefixes of different lengths
        keep = b % n
        input_ids.view(graph_bs, n)[b, 1 : keep + 1] = target[b, :keep]
    return logits, input_ids


@case
def case_graph_verify_epilogue() -> dict[str, Any]:
    """0011 in the engine's order: the epilogue registered as the worker does, every target verify graph of every
    adaptive runner captured through ``capture_tail_hooks`` (as ``capture_one_shape`` calls them), then per step:
    the current runner swapped (``apply_runtime_state``), its graph replayed (the captured hooks run again on the
    step's padded inputs), ``attach_graph_verify_outputs`` (run_eagle_verify) and the real ``eagle_sample``. Stock
    runs ``eagle_sample`` eagerly on the same logits."""
    from types import SimpleNamespace

    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    eu: Any = __import__("sglang.srt.speculative.eagle_utils", fromlist=["x"])

    def verify_input(input_ids: torch.Tensor, bs: int, n: int) -> Any:
        node = torch.arange(n)
        return EagleVerifyInput(
            draft_token=input_ids[: bs * n].clone(),
            custom_mask=torch.ones(bs * n * n, dtype=torch.bool),
            positions=torch.zeros(bs * n, dtype=torch.long),
            retrieve_index=torch.arange(bs).unsqueeze(1) * n + node,
            retrieve_next_token=torch.where(node < n - 1, node + 1, -1).expand(bs, n).contiguous(),
            retrieve_next_sibling=torch.full((bs, n), -1, dtype=torch.long),
            retrieve_cum_len=None,
            spec_steps=n - 1,
            topk=1,
            draft_token_num=n,
            capture_hidden_mode=None,
            seq_lens_sum=None,
            seq_lens_cpu=None,
        )

    def batch(bs: int) -> Any:
        return SimpleNamespace(
            device="cpu",
            forward_mode=ForwardMode.DECODE,
            seq_lens=torch.zeros(bs),
            sampling_info=_GreedyInfo(),
            return_logprob=False,
            req_pool_indices=torch.arange(bs),
        )

    def sample(
        logits: torch.Tensor, input_ids: torch.Tensor, bs: int, n: int, out: Any = None, attach: Any = None
    ) -> tuple[Any, list[str]]:
        """The real eagle_sample (after ``attach``, run_eagle_verify's step, when given); returns its outputs and the
        launches of that eager work (what runs between the verify replay and the commit)."""
        out = out or LogitsProcessorOutput(next_token_logits=logits[: bs * n].clone())
        spec_input, spec_batch = verify_input(input_ids, bs, n), batch(bs)
        # a unit process publishes no server args: eagle_sample reads only these two spec settings
        saved, eu.get_spec = (
            eu.get_spec,
            lambda: SimpleNamespace(
                speculative_use_rejection_sampling=False, speculative_use_block_verification=False
            ),
        )
        try:
            with _Launches(eu) as count:
                if attach is not None:
                    attach(out, spec_input)
                predict, accept_lens, accept_index = eu.eagle_sample(spec_input, spec_batch, out)
        finally:
            eu.get_spec = saved
        return tl([predict, accept_lens, accept_index]), count.ops

    ref, ref_launches = [], []
    for i, (name, graph_bs, bs) in enumerate(_VERIFY_STEPS):
        n = _VERIFY_RUNNERS[name][0] if name else 4
        logits, input_ids = _verify_step_inputs(n, max(graph_bs, bs), 100 + i)
        result, ops = sample(logits, input_ids, bs, n)
        ref.append(result)
        ref_launches.append(ops)
    if not hasattr(eu, "ChainGreedyVerifyEpilogue"):
        return {"ref": ref, "new": None, "eager_launches": ref_launches}

    epilogue = eu.ChainGreedyVerifyEpilogue(4, 8, "cpu")  # registered at startup: 3 steps, max_bs 8
    model_runner = SimpleNamespace(
        is_draft_worker=False,
        chain_verify_epilogue=epilogue,
        capture_tail_hooks=[epilogue.capture_hook],
        decode_cuda_graph_runner=None,
    )

    class Runner:  # a DecodeCudaGraphRunner as the hooks see it (its model_runner, the bs of its last replay)
        bs: int | None

        def __init__(self) -> None:
            self.model_runner, self.bs = model_runner, None

    runners = {name: Runner() for name in _VERIFY_RUNNERS}

    def run_tail_hooks(
        runner: Any, logits: torch.Tensor, input_ids: torch.Tensor, graph_bs: int, n: int
    ) -> None:
        fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=graph_bs, input_ids=input_ids)
        for hook in model_runner.capture_tail_hooks:
            hook(runner, LogitsProcessorOutput(next_token_logits=logits), fb, graph_bs * n)

    captured = []  # ops the hooks add to each captured graph
    for seed, (name, (n, sizes)) in enumerate(_VERIFY_RUNNERS.items()):  # capture (warmup inputs)
        for size in sizes:
            logits, input_ids = _verify_step_inputs(n, size, 900 + 10 * seed + size)
            with _Launches(eu) as count:
                run_tail_hooks(runners[name], logits, input_ids, size, n)
            captured.append(count.ops)
    new, used, launches = [], [], []
    for i, (name, graph_bs, bs) in enumerate(_VERIFY_STEPS):
        n = _VERIFY_RUNNERS[name][0] if name else 4
        logits, input_ids = _verify_step_inputs(n, max(graph_bs, bs), 100 + i)
        if name is not None:
            runner = model_runner.decode_cuda_graph_runner = runners[name]  # apply_runtime_state
            runner.bs = graph_bs
            run_tail_hooks(runner, logits, input_ids, graph_bs, n)  # the replay re-runs the captured tail
        out = LogitsProcessorOutput(next_token_logits=logits[: bs * n].clone())
        replayed = name is not None
        result, ops = sample(
            logits,
            input_ids,
            bs,
            n,
            out,
            attach=lambda o, vi, bs=bs, replayed=replayed: eu.attach_graph_verify_outputs(
                model_runner, o, vi, bs, replayed
            ),
        )
        new.append(result)
        used.append(getattr(out, "graph_verify_outputs", None) is not None)
        launches.append(ops)
    usable = {"plain": eu.graph_verify_usable(_GreedyInfo(), None, None)}
    for attr, value in (
        ("is_all_greedy", False),
        ("acc_additive_penalties", torch.zeros(1)),
        ("acc_scaling_penalties", torch.ones(1)),
        ("logit_bias", torch.zeros(1)),
        ("has_custom_logit_processor", True),
    ):
        info = _GreedyInfo()
        setattr(info, attr, value)
        usable[attr] = eu.graph_verify_usable(info, None, None)
    usable["grammar"] = eu.graph_verify_usable(_GreedyInfo(), object(), None)
    wm = _GreedyInfo()
    wm.has_watermark_candidates = True
    usable["watermark"] = eu.graph_verify_usable(wm, None, object())
    return {
        "ref": ref,
        "new": new,
        "graph_used": used,
        "usable": usable,
        "eager_launches": launches,
        "graph_launches": captured,
    }


# --- sampling-fusion --------------------------------------------------------------------------------------------


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
    # both ranks done before either closes its sockets: a rank still receiving when its peer tears gloo down aborts
    # (SIGABRT in one fresh-clone CI run of 2026-12-04; not reproduced in 46 reruns)
    dist.barrier()
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
        return {
            "chi2": chi2,
            "dof": int(support.sum()) - 1,
            "outside_support": int(counts[~support].sum()),
            "greedy_ok": True,
        }

    def greedy_check(flag: str) -> bool:
        g = torch.Generator().manual_seed(8)
        p = torch.softmax(torch.randn(64, 100, generator=g), -1)
        with flags(SGLANG_OPT_GUMBEL_TOPK_TOPP_SAMPLE=flag):
            ids = sampler.top_k_top_p_min_p_sampling_from_probs_torch(
                p.clone(),
                torch.ones(64, dtype=torch.int32),
                torch.ones(64),
                torch.zeros(64),
                False,
                None,
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

    fp4_attrs = (
        "weight_scale",
        "weight_global_scale",
        "workspace",
        "input_size_per_partition",
        "output_size_per_partition",
    )
    w4a16_attrs = (
        "weight_scale_interleaved",
        "alpha",
        "input_size_per_partition",
        "output_size_per_partition",
    )
    w4a4_attrs = w4a16_attrs + ("input_scale_inv",)
    heads = {
        "bf16": _Head(torch.zeros(2, 2, dtype=torch.bfloat16)),
        "int32_fp4": _Head(torch.zeros(2, 2, dtype=torch.int32), **dict.fromkeys(fp4_attrs, 1)),
        "uint8_w4a16": _Head(torch.zeros(2, 2, dtype=torch.uint8), **dict.fromkeys(w4a16_attrs, 1)),
        "uint8_w4a4": _Head(torch.zeros(2, 2, dtype=torch.uint8), **dict.fromkeys(w4a4_attrs, 1)),
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
    defs = sum(
        isinstance(n, ast.FunctionDef) and n.name == "should_apply_lm_head_quant_method" for n in tree.body
    )
    return {"ref": table, "definitions": defs, "new": True}


def _logits_processor(**attrs: Any) -> Any:
    """A real LogitsProcessor (its methods run unmodified) without the server context its __init__ reads: only the
    attributes _compute_lm_head and the FP8 predicate read are set."""
    from sglang.srt.layers.logits_processor import LogitsProcessor

    lp = LogitsProcessor.__new__(LogitsProcessor)
    torch.nn.Module.__init__(lp)
    for k, v in {
        "use_fp32_lm_head": False,
        "use_fp32_lm_head_output": False,
        "rl_on_policy_target": None,
        **attrs,
    }.items():
        setattr(lp, k, v)
    return lp


def _causal_lm(weight: torch.Tensor, **lp_attrs: Any) -> Any:
    """The module shape prepare_fp8_lm_heads walks: a CausalLM owning ``lm_head`` and ``logits_processor``."""
    model = torch.nn.Module()
    model.lm_head = torch.nn.Module()
    model.lm_head.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    model.logits_processor = _logits_processor(**lp_attrs)
    return model


def _tiny_lm_head_weight() -> torch.Tensor:
    from safetensors.torch import load_file

    model_dir = os.environ.get("OVERLAY_SGLANG_MODEL_DIR")
    if not model_dir:
        return torch.randn(512, 64, generator=torch.Generator().manual_seed(9)) * 0.05
    weights: Any = load_file(os.path.join(model_dir, "model.safetensors"))
    return weights.get("lm_head.weight", weights.get("model.embed_tokens.weight")).float()


class _LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):  # type: ignore[misc]
    """Live and peak bytes of the storages created under the mode (freed when their last tensor dies)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.refs: dict[int, int] = {}

    def _drop(self, key: int, nbytes: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        import weakref

        out = func(*args, **(kwargs or {}))
        inputs = {
            a.untyped_storage().data_ptr()
            for a in torch.utils._pytree.tree_flatten((args, kwargs))[0]
            if isinstance(a, torch.Tensor)
        }
        for t in torch.utils._pytree.tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                key, nbytes = st.data_ptr(), st.nbytes()
                if key in inputs and key not in self.refs:
                    continue  # a view of, or a write into, a tensor made before the mode
                if key not in self.refs:
                    self.refs[key] = 0
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                self.refs[key] += 1
                weakref.finalize(t, self._drop, key, nbytes)
        return out


@case
def case_fp8_lm_head() -> dict[str, Any]:
    """0006 through the real LogitsProcessor._compute_lm_head on the tiny llama's lm_head weight: stock (flag off)
    vs the FP8 copy made by prepare_fp8_lm_heads as ModelRunner.initialize makes it."""
    weight = _tiny_lm_head_weight()
    g = torch.Generator().manual_seed(9)
    hidden = torch.randn(256, weight.shape[1], generator=g)
    model = _causal_lm(weight)
    with flags(SGLANG_OPT_FP8_LM_HEAD="0"):
        ref = model.logits_processor._compute_lm_head(hidden, model.lm_head)
    out: dict[str, Any] = {"ref": {"shape": list(ref.shape), "dtype": str(ref.dtype)}, "new": None}
    f: Any = (
        __import__("sglang.srt.layers.quantization.fp8_lm_head", fromlist=["x"])
        if optional("sglang.srt.layers.quantization.fp8_lm_head", "FP8_MAX") is not None
        else None
    )
    if f is None:
        return out
    before = model.lm_head.weight.detach().clone()
    with flags(SGLANG_OPT_FP8_LM_HEAD="1"):
        made = f.prepare_fp8_lm_heads(model)
        logits = model.logits_processor._compute_lm_head(hidden, model.lm_head)
        # a second CausalLM holding the same tensor (shared MTP head / tied embedding) reuses the copy
        draft = torch.nn.Module()
        draft.lm_head = torch.nn.Module()
        draft.lm_head.weight = model.lm_head.weight
        draft.logits_processor = _logits_processor()
        f.prepare_fp8_lm_heads(draft)
    copy = f.fp8_lm_head_copy(model.lm_head)
    deq = copy.qweight.float() * copy.scale
    # E4M3 rounds to 3 mantissa bits: at most 16 / 448 of the row's max |w| (half a step at the top binade)
    per_elem = ((deq - weight).abs() / (copy.scale * f.FP8_MAX).clamp_min(1e-30)).max().item()
    span = (ref.max(-1).values - ref.min(-1).values).clamp_min(1e-30)
    rel = ((logits.float() - ref).abs().max(-1).values / span).max().item()
    out["new"] = {
        "prepared": made,
        "shape": list(logits.shape),
        "dtype": str(logits.dtype),
        "weight_err_rel_row_max": per_elem,
        "logit_err_rel_span": rel,
        "top1_agreement": (logits.argmax(-1) == ref.argmax(-1)).float().mean().item(),
        "shared_copy": f.fp8_lm_head_copy(draft.lm_head) is copy,
        "weight_unchanged": bool(torch.equal(before, model.lm_head.weight)),
        "real_weight": bool(os.environ.get("OVERLAY_SGLANG_MODEL_DIR")),
    }
    return out


@case
def case_fp8_lm_head_lifecycle() -> dict[str, Any]:
    """0006: when the copy is made and what it costs (live storage bytes under a dispatch mode), the fp32-output
    contract of _compute_lm_head, and an online weight update through upstream's update_weights_from_tensor."""
    import ast
    import inspect
    import textwrap
    from types import SimpleNamespace

    f: Any = (
        __import__("sglang.srt.layers.quantization.fp8_lm_head", fromlist=["x"])
        if optional("sglang.srt.layers.quantization.fp8_lm_head", "FP8_MAX") is not None
        else None
    )
    if f is None or not hasattr(f, "prepare_fp8_lm_heads"):
        return {"ref": None, "new": None}
    from sglang.srt.model_executor import model_runner as mr
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    g = torch.Generator().manual_seed(23)
    new: dict[str, Any] = {}
    saved_chunk, f.CHUNK_BYTES = f.CHUNK_BYTES, 1 << 20  # 1 MiB chunks against a 4 MiB head (default 64 MiB)
    try:
        return _fp8_lm_head_lifecycle(f, mr, WeightUpdater, g, new, ast, inspect, textwrap, SimpleNamespace)
    finally:
        f.CHUNK_BYTES = saved_chunk


def _fp8_lm_head_lifecycle(
    f: Any,
    mr: Any,
    WeightUpdater: Any,
    g: torch.Generator,
    new: dict[str, Any],
    ast: Any,
    inspect: Any,
    textwrap: Any,
    SimpleNamespace: Any,
) -> dict[str, Any]:
    # (1) load time: ModelRunner.initialize makes the copies before returning; the KV cache is sized later, by
    # alloc_memory_pool (never called from initialize)
    init_src = ast.unparse(ast.parse(textwrap.dedent(inspect.getsource(mr.ModelRunner.initialize))))
    new["initialize_prepares"] = "prepare_fp8_lm_heads(self.model)" in init_src
    new["initialize_sizes_kv"] = "alloc_memory_pool" in init_src or "init_memory_pool" in init_src
    # (2) cost: a 4096 x 512 bf16 head (4 MiB), 1 MiB chunks; then the first call must allocate no weight-sized copy
    weight = (torch.randn(4096, 512, generator=g) * 0.02).to(torch.bfloat16)
    model = _causal_lm(weight)
    wbytes = weight.numel() * weight.element_size()
    with flags(SGLANG_OPT_FP8_LM_HEAD="1"):
        with _LiveBytes() as load:
            f.prepare_fp8_lm_heads(model, chunk_bytes=f.CHUNK_BYTES)
        copy = f.fp8_lm_head_copy(model.lm_head)
        kept = copy.qweight.numel() + copy.scale.numel() * 4
        hidden = torch.randn(4, 512, generator=g).to(torch.bfloat16)
        with _LiveBytes() as first_call:
            logits = model.logits_processor._compute_lm_head(hidden, model.lm_head)
    new["load_peak_over_weight"] = load.peak / wbytes
    new["load_transient_over_weight"] = (load.peak - kept) / wbytes
    new["kept_over_weight"] = kept / wbytes
    new["first_call_peak_over_weight"] = first_call.peak / wbytes
    new["first_call_dtype"] = str(logits.dtype)
    # (3) fp32 lm_head output (models with enable_lm_head_output_fp32): on CUDA the stock branch returns fp32
    # logits written into the caller's logits buffer (torch.mm(out_dtype=float32, out=out)). A CUDA-shaped call:
    # hidden reports is_cuda, so _compute_lm_head takes that contract; the GEMM runs its reference math here.

    class CudaShaped(torch.Tensor):  # type: ignore[misc]
        @property
        def is_cuda(self) -> bool:
            return True

    m32 = _causal_lm(weight, use_fp32_lm_head_output=True)
    buf = torch.empty(4, 4096, dtype=torch.float32)
    saved = f._use_scaled_mm
    f._use_scaled_mm = lambda x, q: False
    try:
        with flags(SGLANG_OPT_FP8_LM_HEAD="1"):
            f.prepare_fp8_lm_heads(m32)
            got = m32.logits_processor._compute_lm_head(hidden.as_subclass(CudaShaped), m32.lm_head, out=buf)
    finally:
        f._use_scaled_mm = saved
    exact = hidden.double() @ m32.lm_head.weight.double().T
    new["fp32_output"] = {
        "dtype": str(got.dtype),
        "into_out_buffer": got.data_ptr() == buf.data_ptr(),
        "max_err_rel": float((got.double() - exact).abs().max() / exact.abs().max()),
    }
    # (4) online update through upstream's update_weights_from_tensor (load_format="direct": the default weight
    # loader, param.data.copy_, which does not bump the tensor version), on the weight updater of a CPU runner
    upd = _causal_lm(weight)
    with flags(SGLANG_OPT_FP8_LM_HEAD="1"):
        f.prepare_fp8_lm_heads(upd)
        held = f.fp8_lm_head_copy(upd.lm_head)
        held_ptr = held.qweight.data_ptr()  # what a captured graph reads
        fresh_weight = (torch.randn(4096, 512, generator=g) * 0.02).to(torch.bfloat16)
        runner = SimpleNamespace(
            get_model=lambda: upd,
            device="cpu",
            custom_weight_loaders={},
            _assert_weight_cache_inactive=lambda op: None,
        )
        from sglang.srt.runtime_context import get_parallel

        with get_parallel().override(tp_rank=0):  # a single-rank process (no groups built here)
            ok, msg = WeightUpdater.update_weights_from_tensor(
                runner, [("lm_head.weight", fresh_weight)], load_format="direct"
            )
        after = model.logits_processor._compute_lm_head(hidden, upd.lm_head)
        reference = _causal_lm(fresh_weight)
        f.prepare_fp8_lm_heads(reference)
        expected = reference.logits_processor._compute_lm_head(hidden, reference.lm_head)
    now = f.fp8_lm_head_copy(upd.lm_head)
    new["update"] = {
        "ok": bool(ok),
        "message": msg,
        "weight_updated": bool(torch.equal(upd.lm_head.weight, fresh_weight)),
        "same_storage": now is held and now.qweight.data_ptr() == held_ptr,
        "storage_current": bool(
            torch.equal(
                held.qweight.view(torch.uint8),
                f.fp8_lm_head_copy(reference.lm_head).qweight.view(torch.uint8),
            )
        ),
        "eager_logits_current": bool(torch.equal(after, expected)),
    }
    return {"ref": None, "new": new}


# --- kernel-injection ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _deep_gemm_layout_helpers() -> Iterator[None]:
    """DeepGEMM's two host-side layout helpers (``deep_gemm.utils.align``/``get_tma_aligned_size``, 16-byte TMA
    alignment) and its packed-UE8M0 layout function, served from upstream's own torch copy of it
    (``fp8_utils._get_mn_major_tma_aligned_packed_ue8m0_tensor_torch_impl``, "Copied from DeepGEMM tests"), so that
    upstream's ``requant_weight_ue8m0`` runs unmodified on a machine without deep_gemm. Removed on exit."""
    import types

    from sglang.srt.layers.quantization import fp8_utils

    assert "deep_gemm" not in sys.modules, "a real deep_gemm is importable here; the stand-in would shadow it"
    root, utils, layout = (
        types.ModuleType(n) for n in ("deep_gemm", "deep_gemm.utils", "deep_gemm.utils.layout")
    )
    utils.align = lambda x, y: (x + y - 1) // y * y  # type: ignore[attr-defined]
    utils.get_tma_aligned_size = lambda x, element_size: utils.align(x, 16 // element_size)  # type: ignore[attr-defined]
    layout.get_mn_major_tma_aligned_packed_ue8m0_tensor = (  # type: ignore[attr-defined]
        fp8_utils._get_mn_major_tma_aligned_packed_ue8m0_tensor_torch_impl
    )
    root.utils, utils.layout = utils, layout  # type: ignore[attr-defined]
    sys.modules.update({"deep_gemm": root, "deep_gemm.utils": utils, "deep_gemm.utils.layout": layout})
    try:
        yield
    finally:
        for name in ("deep_gemm", "deep_gemm.utils", "deep_gemm.utils.layout"):
            sys.modules.pop(name, None)


@case
def case_splitk_ue8m0_scales() -> dict[str, Any]:
    """0007 with the scales the linear really receives on SM100 + DeepGEMM from a checkpoint whose scales are not
    UE8M0: ``process_weights_after_loading`` requants them with upstream ``requant_weight_ue8m0`` into packed int32
    (N, K/512), and ``dispatch_w8a8_block_fp8_linear(act_scale_ue8m0=False)`` builds the linear that gets them. The
    stock linear (DeepGEMM with its Triton fallback, which unpacks the int32 layout) is stood in by upstream's own
    unpack ``_unpack_ue8m0_scale_for_triton`` + the exact float64 block GEMM; the patched linear is the real router
    of the dispatcher, wrapped around that default."""
    from sglang.srt.layers.quantization import fp8_utils

    g = torch.Generator().manual_seed(22)
    m, n, k = 3, 256, 640
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g) * 0.05
    ws = torch.rand(n // 128, k // 128, generator=g) * 0.01 + 0.001
    wq = (w / ws.repeat_interleave(128, 0).repeat_interleave(128, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    with _deep_gemm_layout_helpers():
        rq_w, rq_s = fp8_utils.requant_weight_ue8m0(wq, ws, [128, 128])
    unpacked = fp8_utils._unpack_ue8m0_scale_for_triton(rq_s, tuple(rq_w.shape), [128, 128])
    calls: list[str] = []

    def exact(inp: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        xf = inp.float().view(inp.shape[0], -1, 128)
        s_x = xf.abs().amax(-1).clamp_min(1e-10) / 448.0
        q_x = (xf * (1.0 / s_x).unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn)
        deq_x = (q_x.double() * s_x.double().unsqueeze(-1)).view(inp.shape[0], -1)
        deq_w = weight.double() * scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
        return deq_x @ deq_w.T

    def default(
        inp: Any,
        weight: Any,
        block_size: Any,
        scale: Any,
        input_scale: Any = None,
        bias: Any = None,
        **kw: Any,
    ) -> torch.Tensor:
        calls.append(str(scale.dtype))
        if scale.dtype == torch.int32:  # the stock DeepGEMM fallback's unpack
            scale = fp8_utils._unpack_ue8m0_scale_for_triton(scale, tuple(weight.shape), block_size)
        return exact(inp, weight, scale).to(inp.dtype)

    reference = exact(x, rq_w, unpacked)
    ref = {
        "scale_dtype": str(rq_s.dtype),
        "scale_shape": list(rq_s.shape),
        "out": tl(default(x, rq_w, [128, 128], rq_s).float()),
    }
    calls.clear()
    if optional("sglang.kernels.ops.gemm.splitk_fp8", "small_m_splitk_router") is None:
        return {"ref": ref, "new": None}
    from sglang.srt.layers.quantization import fp8_utils as fu

    saved = fu._dispatch_auto_backend
    fu._dispatch_auto_backend = lambda **kw: (
        default
    )  # the backend the dispatcher would pick (DeepGEMM on SM100)
    try:
        with flags(SGLANG_OPT_SPLITK_FP8_GEMM="1"):
            linear = fu.dispatch_w8a8_block_fp8_linear([128, 128], act_scale_ue8m0=False)
    finally:
        fu._dispatch_auto_backend = saved
    ulp = (reference.abs() * 2.0**-8).clamp_min(1e-6)
    new: dict[str, Any] = {"routed": linear is not default}
    for name, scale in (
        ("int32_packed", rq_s),
        ("fp32_unpacked", unpacked),
        ("fp32_wrong_shape", unpacked.repeat_interleave(128, 0)),
    ):
        calls.clear()
        try:
            out = linear(x, rq_w, [128, 128], scale, None, None)
            err = float(((out.double() - reference).abs() / ulp).max())
            new[name] = {
                "default_calls": list(calls),
                "max_err_in_bf16_ulps": err,
                "out": tl(out.float()) if name == "int32_packed" else None,
            }
        except Exception as exc:
            new[name] = {"default_calls": list(calls), "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    return {"ref": ref, "new": new}


def _exact_splitk_inputs(m: int, n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Inputs whose per-token-group activation quantization is exact (E4M3 grid values times a power-of-two scale,
    one element per group at 448 * s), so the interpreter's fp32 -> E4M3 rounding bug cannot show."""
    groups = (k + 127) // 128
    q = (torch.randn(m, k, generator=g) * 60).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    q[:, ::128] = 448.0
    s = 2.0 ** torch.randint(-12, -2, (m, groups), generator=g).float()
    x = (q * s.repeat_interleave(128, 1)[:, :k]).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    ws = torch.rand((n + 127) // 128, groups, generator=g) * 0.01 + 0.001
    deq_w = w.double() * ws.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return x, w, ws, x.double() @ deq_w.T


# Triton 3.7's interpreter gets two conversions of the kernel wrong that a GPU does not: bf16 ``tl.dot`` (errors
# ~1e13 ulps) and the fp32 -> bf16 store cast (it truncates where CUDA rounds to nearest even: 506 of 1024 random
# values differ from torch's cast). The exact copy moves both out of its way: E4M3 operands go into the dot as fp32
# (exact in both types), and the output is stored as fp32 and rounded by torch (RNE, as CUDA's cvt.rn.bf16.f32).
_EXACT_COPY = (
    (".to(tl.bfloat16)", ".to(tl.float32)"),
    (".to(out_ptr.dtype.element_ty)", ".to(tl.float32)"),
    ("out = torch.empty((m, n), dtype=input.dtype,", "out = torch.empty((m, n), dtype=torch.float32,"),
    ("return out.reshape(*input.shape[:-1], n)", "return out.to(input.dtype).reshape(*input.shape[:-1], n)"),
)


@case
def case_splitk_triton_interp() -> dict[str, Any]:
    """0007's Triton kernels themselves (not the torch reference), through the interpreter (TRITON_INTERPRET=1), vs
    the torch reference and float64, from an exact copy of the module's source (_EXACT_COPY: what the interpreter
    gets wrong and a GPU does not), with and without a bias, 1/2/5 splits (1: the kernel stores the output itself;
    more: the reduce kernel sums the partials in split order and casts)."""
    import importlib.util
    import inspect
    import tempfile

    sk = optional("sglang.kernels.ops.gemm.splitk_fp8", "splitk_w8a8_block_fp8_linear")
    if sk is None:
        return {"ref": None, "new": None}
    from sglang.kernels.ops.gemm import splitk_fp8

    source = inspect.getsource(splitk_fp8)
    replaced = {old: source.count(old) for old, _ in _EXACT_COPY}
    shimmed = source
    for old, new in _EXACT_COPY:
        shimmed = shimmed.replace(old, new)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "splitk_fp8_exact_copy.py")
        with open(path, "w") as fh:
            fh.write(shimmed)
        spec = importlib.util.spec_from_file_location("splitk_fp8_exact_copy", path)
        assert spec is not None and spec.loader is not None
        exact_copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(exact_copy)
        g = torch.Generator().manual_seed(24)
        cases = []
        for m, n, k in ((1, 256, 640), (3, 256, 640), (16, 128, 512), (1, 200, 600), (5, 130, 300)):
            x, w, ws, exact = _exact_splitk_inputs(m, n, k, g)
            bias = (torch.randn(n, generator=g) * exact.abs().mean()).to(torch.bfloat16)
            for with_bias in (False, True):
                b = bias if with_bias else None
                want = exact + (bias.double() if with_bias else 0.0)
                ulp = (want.abs() * 2.0**-8).clamp_min(1e-12)
                for splits in (1, 2, 5):
                    got = exact_copy.splitk_w8a8_block_fp8_linear(
                        x, w, [128, 128], ws, bias=b, split_k=splits
                    )
                    ref = splitk_fp8.splitk_w8a8_block_fp8_linear_torch(
                        x, w, [128, 128], ws, bias=b, split_k=splits
                    )
                    cases.append(
                        {
                            "m": m,
                            "n": n,
                            "k": k,
                            "bias": with_bias,
                            "splits": splits,
                            "equal_torch_ref": bool(torch.equal(got, ref)),
                            "max_err_in_bf16_ulps": float(((got.double() - want).abs() / ulp).max()),
                        }
                    )
        x, w, ws, exact = _exact_splitk_inputs(3, 256, 640, g)
        as_shipped = splitk_fp8.splitk_w8a8_block_fp8_linear(x, w, [128, 128], ws, split_k=2)
        shipped_err = float(
            ((as_shipped.double() - exact).abs() / (exact.abs() * 2.0**-8).clamp_min(1e-12)).max()
        )
    return {
        "ref": None,
        "new": {"replaced": replaced, "cases": cases, "as_shipped_interpreter_err_in_bf16_ulps": shipped_err},
    }


class _KernelLaunches:
    """Launches of one call as a GPU would see them: every Triton kernel launch (the interpreter's; with
    ``run=False`` recorded without running it, for kernels the interpreter cannot run) and every aten op outside
    them that is a kernel launch (views and allocation-only ops excluded, as _Launches)."""

    def __init__(self, *, run: bool = True) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from triton.runtime.interpreter import InterpretedFunction

        counter = self
        self.ops: list[str] = []
        self._depth, self._run, self._cls = 0, run, InterpretedFunction

        class Mode(TorchDispatchMode):  # type: ignore[misc]
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                name = func.overloadpacket.__name__
                if not counter._depth and not func.is_view and name not in _Launches._NO_KERNEL:
                    counter.ops.append(name)
                return func(*args, **(kwargs or {}))

        self._mode = Mode()

    def __enter__(self) -> _KernelLaunches:
        original = self._saved = self._cls.run

        def launch(fn: Any, *args: Any, **kwargs: Any) -> Any:
            self.ops.append(f"triton:{fn.fn.__name__}")
            if not self._run:
                return None
            self._depth += 1
            try:
                return original(fn, *args, **kwargs)
            finally:
                self._depth -= 1

        self._cls.run = launch
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        self._cls.run = self._saved


@case
def case_splitk_launches() -> dict[str, Any]:
    """0007's mechanism, counted: kernel launches of one small-M block-FP8 linear call (M 3, N 256, K 640), the
    stock dispatched Triton linear (fp8_utils.triton_w8a8_block_fp8_linear: per-token-group quant, then the block GEMM;
    its launches recorded, not run: the interpreter cannot run the fp8 dot) vs the split-K kernel at 1, 2 and 5
    splits, without and with a bias."""
    from sglang.srt.layers.quantization import fp8_utils

    g = torch.Generator().manual_seed(11)
    m, n, k = 3, 256, 640
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    ws = torch.rand(n // 128, k // 128, generator=g) * 0.01 + 0.001
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    from sglang.kernels.ops.gemm import fp8_kernel as gemm_kernels

    stock = {}
    saved = gemm_kernels.get_device_name
    gemm_kernels.get_device_name = lambda *a, **kw: (
        "NVIDIA H200"
    )  # the config lookup names a GPU (none tuned here)
    try:
        for name, b in (("no_bias", None), ("bias", bias)):
            with _KernelLaunches(run=False) as c:
                fp8_utils.triton_w8a8_block_fp8_linear(x, w, [128, 128], ws, None, b)
            stock[name] = c.ops
    finally:
        gemm_kernels.get_device_name = saved
    sk = optional("sglang.kernels.ops.gemm.splitk_fp8", "splitk_w8a8_block_fp8_linear")
    if sk is None:
        return {"ref": stock, "new": None}
    new = {}
    for splits in (1, 2, 5):
        for name, b in (("no_bias", None), ("bias", bias)):
            with _KernelLaunches() as c:
                sk(x, w, [128, 128], ws, bias=b, split_k=splits)
            new[f"splits{splits}_{name}"] = c.ops
    return {"ref": stock, "new": new}


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
    q_x = (
        (xf * (1.0 / s_x).unsqueeze(-1)).clamp(fp8_kernel.fp8_min, fp8_kernel.fp8_max).to(torch.float8_e4m3fn)
    )
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
            "dequant_max_rel_err": float(
                ((deq - norm_out.float()).abs() / amax.repeat_interleave(128, 1)).max()
            ),
            "scales_pow2": bool(torch.equal(log2, log2.round())),
            "scales_cover_max": bool((amax / scale <= 448.0).all()),
            "packed_exponents_ok": bool(torch.equal(exps, log2.round().to(torch.int64) + 127)),
            "deepgemm_layout_ok": bool(layout_ok),
        },
    }


# --- mtp --------------------------------------------------------------------------------------------------------


@case
def case_cpu_sampling_verify() -> dict[str, Any]:
    from sglang.srt.speculative import eagle_utils as eu

    fn = getattr(eu, "tree_speculative_sampling_target_only_torch", None)
    g = torch.Generator().manual_seed(12)
    vocab, n = 16, 4
    # the renorm comparison: masks of the stock pytorch sampler (top_k_top_p_min_p_sampling_from_probs_torch,
    # called for real with return_filtered_probs) on random rows plus dyadic rows whose cumulative mass hits
    # top_p exactly (0.5, 0.75, 0.875 are sums of leading probabilities), where `<` and `<=` differ
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch as stock_sampler

    dyadic = torch.tensor([2.0**-i for i in range(1, vocab)] + [2.0 ** -(vocab - 1)])
    boundary = torch.stack([dyadic[torch.randperm(vocab, generator=g)] for _ in range(3)])
    probs = torch.cat([torch.softmax(torch.randn(6, vocab, generator=g), -1), boundary])
    top_ks = torch.tensor([1, 3, 5, 16, 2, 8, 2, 3, 4], dtype=torch.int32)
    top_ps = torch.tensor([1.0, 0.9, 0.5, 0.3, 1.0, 0.8, 0.5, 0.75, 0.875])
    rows = probs.shape[0]

    def stock_mask(ks: torch.Tensor, ps: torch.Tensor) -> Any:
        _, kept, order, _ = stock_sampler(
            probs.clone(),
            ks,
            ps,
            torch.zeros(rows),
            False,
            None,
            torch.zeros(rows, dtype=torch.long),
            return_filtered_probs=True,
        )
        return tl(torch.zeros_like(probs, dtype=torch.bool).scatter(1, order.long(), kept > 0))

    ref_mask_k = stock_mask(top_ks, torch.ones(rows))
    ref_mask_p = stock_mask(torch.full((rows,), vocab, dtype=torch.int32), top_ps)
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
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=num,
            candidates=drafts,
            retrive_index=node.view(1, n),
            retrive_next_token=torch.where(node < n - 1, node + 1, -1).view(1, n),
            retrive_next_sibling=torch.full((1, n), -1),
            uniform_samples=torch.rand(1, n, generator=g),
            uniform_samples_for_final_sampling=torch.rand(1, generator=g),
            target_probs=target.view(1, n, vocab),
            draft_probs=torch.zeros(1, n, vocab),
            threshold_single=1.0,
            threshold_acc=1.0,
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
    return {
        "ref": None,
        "new": {
            "buckets": buckets,
            "snapshot": stats.snapshot(),
            "labels": [a.workload_label(None), a.workload_label({"workload": "x" * 40})],
        },
    }


def main() -> int:
    payload = json.load(sys.stdin)
    out: dict[str, Any] = {"version": 1, "cases": {}}
    for name in payload["cases"]:
        try:
            out["cases"][name] = CASES[name]()
        except Exception:
            out["cases"][name] = {"error": traceback.format_exc()[-3000:]}
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
