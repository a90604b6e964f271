#!/usr/bin/env python3
"""One configuration of the vLLM device check, in its own process (vLLM registers torch ops at import, so two trees
never share one): the real vLLM functions of one tree on CUDA tensors (or, with ``--dry-run``, CPU tensors), each
case run twice on fresh copies of the same seeded inputs, the second time counted (scripts/device's cuda_census: the
GPU instrument, or the CPU census on a dry run); the outputs saved for vllm_check.py to compare across
configurations. Started by scripts/device/vllm_check.py; standard library and torch only (never imports overlay).

The tree is put first on ``sys.path`` with vllm_native.py's stand-ins for the native modules it lacks;
``VLLM_USE_FLASHINFER_SAMPLER=0`` (FlashInfer is not on the device and no patch touches its sampler), and on a dry run
``VLLM_TARGET_DEVICE=cpu``. Every function the series adds to a probed module (``--watch``, found by vllm_check.py)
is wrapped to count its calls per case: on CUDA none may be entered.

``--timing``: the go/no-go for a CUDA variant of 0008 instead (patched tree): stock's ``apply_penalties`` (dense
``[rows, vocab + 1]`` counts) against 0008's ``apply_penalties_at_seen_tokens``, interleaved, at a 151936 vocabulary.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src" / "overlay" / "engines" / "workers"))

import vllm_native

COMPARED = ("host-syncs", "eager-launches", "graph-launches", "h2d-copies", "pageable-copies", "bytes-moved")
# what an import of the probed modules pulls in that 0002 and 0003 keep out of the engine
IMPORT_MARKERS = (
    "torch._inductor",
    "openai",
    "openai_harmony",
    "fastapi",
    "vllm.entrypoints",
    "vllm.reasoning",
)
VOCAB = 151936  # Qwen's, as in docs/engines/vllm.md's measurements
DRY_VOCAB = 4096


@dataclass
class Ctx:
    torch: Any
    device: str
    dry_run: bool
    vocab: int
    m: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    key: str
    name: str
    make: Callable[[], tuple[Any, ...]]  # fresh inputs, same values every time
    call: Callable[..., Any]
    outputs: Callable[[Any], list[Any]]
    note: str | None = None


# --- inputs ----------------------------------------------------------------------------------------------------------


def _gen(ctx: Ctx, seed: int) -> Any:
    return ctx.torch.Generator().manual_seed(seed)


def _logits(ctx: Ctx, rows: int, seed: int, *, width: int | None = None) -> Any:
    torch = ctx.torch
    x = torch.randn(rows, width or ctx.vocab, generator=_gen(ctx, seed)) * 3.0
    return x.to(ctx.device)


def _generators(ctx: Ctx, seeds: dict[int, int]) -> dict[int, Any]:
    return {i: ctx.torch.Generator(device=ctx.device).manual_seed(s) for i, s in seeds.items()}


def _k_p(ctx: Ctx) -> tuple[Any, Any]:
    torch = ctx.torch
    # a row without top-k (k = vocab, as vLLM's input batch writes it) and one without top-p (p = 1) beside the others
    k = torch.tensor([50, 20, ctx.vocab, 1], dtype=torch.int32, device=ctx.device)
    p = torch.tensor([0.9, 0.95, 0.8, 1.0], dtype=torch.float32, device=ctx.device)
    return k, p


def _metadata(ctx: Ctx, rows: int, **values: Any) -> Any:
    """A SamplingMetadata of this tree: the fields it has, vLLM's neutral values for those not given."""
    torch = ctx.torch
    md = ctx.m["metadata"]
    base: dict[str, Any] = {
        "temperature": torch.ones(rows, device=ctx.device),
        "all_greedy": False,
        "all_random": True,
        "top_p": None,
        "top_k": None,
        "generators": {},
        "max_num_logprobs": None,
        "no_penalties": True,
        "prompt_token_ids": None,
        "frequency_penalties": torch.zeros(rows, device=ctx.device),
        "presence_penalties": torch.zeros(rows, device=ctx.device),
        "repetition_penalties": torch.ones(rows, device=ctx.device),
        "output_token_ids": [[] for _ in range(rows)],
        "allowed_token_ids_mask": None,
        "bad_words_token_ids": {},
        "logitsprocs": ctx.m["logitsprocs"].LogitsProcessors(),
    }
    base.update(values)
    names = {f.name for f in dataclasses.fields(md.SamplingMetadata)}
    return md.SamplingMetadata(**{k: v for k, v in base.items() if k in names})


def _penalty_inputs(ctx: Ctx, rows: int, prompt: int, output: int, seed: int) -> tuple[Any, ...]:
    """Prompts padded with the vocabulary size (as the input batch pads them), outputs as lists with async
    scheduling's -1 placeholders, penalties of either sign and rows without penalties."""
    torch = ctx.torch
    g = _gen(ctx, seed)
    v = ctx.vocab
    prompt_t = torch.randint(0, v, (rows, prompt), generator=g)
    for i in range(rows):
        prompt_t[i, prompt - (i * prompt) // (2 * rows) :] = v  # shorter prompts, padded
    outputs = [torch.randint(0, v, (output - 7 * i,), generator=g).tolist() for i in range(rows)]
    if rows > 1:
        outputs[1][-3:] = [-1, -1, -1]
    presence = torch.tensor([0.3, 0.0, -0.2, 0.5][:rows] + [0.1] * max(0, rows - 4))
    frequency = torch.tensor([0.2, 0.1, 0.0, -0.1][:rows] + [0.2] * max(0, rows - 4))
    repetition = torch.tensor([1.05, 1.0, 1.2, 0.9][:rows] + [1.1] * max(0, rows - 4))
    return (
        prompt_t.to(ctx.device),
        presence.to(ctx.device),
        frequency.to(ctx.device),
        repetition.to(ctx.device),
        outputs,
    )


def _spec_inputs(ctx: Ctx, seed: int, *, with_draft_probs: bool) -> dict[str, Any]:
    """A verify step: 4 requests with 2, 3, 1, 3 drafts; drafts partly the target's argmax (so some are accepted)."""
    torch = ctx.torch
    num_draft = [2, 3, 1, 3]
    tokens = sum(num_draft)
    target = _logits(ctx, tokens, seed)
    g = _gen(ctx, seed + 1)
    draft = torch.randint(0, ctx.vocab, (tokens,), generator=g)
    argmax = target.argmax(-1).cpu()
    draft[::2] = argmax[::2]
    cu = torch.tensor(num_draft, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    probs = None
    if with_draft_probs:
        probs = _logits(ctx, tokens, seed + 2).softmax(-1, dtype=torch.float32)
    return {
        "draft_token_ids": draft.to(torch.int32).to(ctx.device),
        "num_draft_tokens": num_draft,
        "max_spec_len": max(num_draft),
        "cu_num_draft_tokens": cu.to(ctx.device),
        "draft_probs": probs,
        "target_logits": target,
        "bonus_token_ids": torch.randint(0, ctx.vocab, (len(num_draft), 1), generator=g).to(ctx.device),
    }


# --- cases -----------------------------------------------------------------------------------------------------------


def cases(ctx: Ctx) -> list[Case]:
    torch = ctx.torch
    tks = ctx.m["topk_topp_sampler"]
    pen = ctx.m["penalties"]
    rs = ctx.m["rejection_sampler"]
    out: list[Case] = []

    def logits_out(r: Any) -> list[Any]:
        return [r]

    for name, use_k, use_p in (("k+p", True, True), ("p", False, True), ("k", True, False)):

        def make(use_k: bool = use_k, use_p: bool = use_p) -> tuple[Any, ...]:
            k, p = _k_p(ctx)
            return (_logits(ctx, 4, 11), k if use_k else None, p if use_p else None)

        out.append(
            Case(
                "sampler",
                f"apply_top_k_top_p:{name}",
                make,
                tks.apply_top_k_top_p,
                logits_out,
                "the dispatch: Triton where vLLM finds it (HAS_TRITON), else the PyTorch path",
            )
        )
        if use_p:
            out.append(
                Case(
                    "sampler",
                    f"apply_top_k_top_p_pytorch:{name}",
                    make,
                    tks.apply_top_k_top_p_pytorch,
                    logits_out,
                    "the PyTorch path as CUDA takes it without Triton (allow_cpu_sync False)",
                )
            )

    def make_native() -> tuple[Any, ...]:
        k, p = _k_p(ctx)
        return (_logits(ctx, 4, 13), _generators(ctx, {0: 7, 2: 11}), k, p)

    sampler = tks.TopKTopPSampler("raw_logprobs")
    out.append(
        Case(
            "sampler",
            "forward_native:seeded",
            make_native,
            lambda logits, gens, k, p: sampler.forward_native(logits, gens, k, p)[0],
            logits_out,
            f"TopKTopPSampler.forward_native (the constructor chose {sampler.forward.__name__}); requests 0 and 2 "
            "seeded",
        )
    )

    full = ctx.m["sampler"].Sampler("raw_logprobs")

    def make_sampler() -> tuple[Any, ...]:
        k, p = _k_p(ctx)
        temp = torch.tensor([0.7, 1.0, 0.5, 0.9], device=ctx.device)
        md = _metadata(ctx, 4, temperature=temp, top_k=k, top_p=p, generators=_generators(ctx, {1: 5}))
        return (_logits(ctx, 4, 17), md)

    out.append(
        Case(
            "sampler",
            "Sampler.forward",
            make_sampler,
            lambda logits, md: full(logits, md).sampled_token_ids,
            logits_out,
            "temperature, top-k/top-p and sampling as the model runner calls them (no penalties: those need the "
            "native repetition kernel on contiguous CUDA logits)",
        )
    )

    prompt_len, output_len = (64, 32) if ctx.dry_run else (512, 256)
    for name, view in (("contiguous", False), ("view", True)):

        def make_pen(view: bool = view) -> tuple[Any, ...]:
            prompt_t, presence, frequency, repetition, outputs = _penalty_inputs(
                ctx, 4, prompt_len, output_len, 19
            )
            if view:
                wide = _logits(ctx, 4, 23, width=ctx.vocab + 64)
                logits = wide[:, : ctx.vocab]
            else:
                logits = _logits(ctx, 4, 23)
            return (logits, prompt_t, presence, frequency, repetition, outputs)

        out.append(
            Case(
                "penalties",
                f"apply_all_penalties:{name}",
                make_pen,
                pen.apply_all_penalties,
                logits_out,
                "non-contiguous logits: the repetition penalty takes vLLM's PyTorch fallback"
                if view
                else "contiguous CUDA logits: the repetition penalty is vLLM's native kernel (a stand-in here)",
            )
        )

    for dtype_name, values, replace in (
        ("float32", [0.0, 0.7, 1.0, 0.0], (0, 1)),
        ("int32", [50, ctx.vocab, 1, 20], (0, 0)),
        ("int64", [3, -1, 0, 9], (-1, 7)),
    ):

        def make_expand(values: list[Any] = values, dtype_name: str = dtype_name) -> tuple[Any, ...]:
            x = torch.tensor(values, dtype=getattr(torch, dtype_name), device=ctx.device)
            cu = torch.tensor([2, 5, 6, 9], dtype=torch.int32, device=ctx.device)
            return (x, cu, 9)

        out.append(
            Case(
                "rejection",
                f"expand_batch_to_tokens:{dtype_name}",
                make_expand,
                functools.partial(rs.expand_batch_to_tokens, replace_from=replace[0], replace_to=replace[1]),
                logits_out,
            )
        )

    def make_constraints() -> tuple[Any, ...]:
        k, p = _k_p(ctx)
        temp = torch.tensor([0.0, 0.8, 1.0, 0.6], device=ctx.device)
        md = _metadata(ctx, 4, temperature=temp, all_random=False, top_k=k, top_p=p)
        cu = torch.tensor([2, 5, 6, 9], dtype=torch.int32, device=ctx.device)
        return (_logits(ctx, 9, 29), cu, md)

    out.append(
        Case(
            "rejection",
            "apply_sampling_constraints",
            make_constraints,
            rs.apply_sampling_constraints,
            logits_out,
        )
    )

    for name, probs, temps in (
        ("draft_probs", True, [0.8, 1.0, 0.7, 0.9]),
        ("no_draft_probs", False, [0.8, 1.0, 0.7, 0.9]),
        ("mixed_greedy", False, [0.0, 0.9, 0.0, 1.0]),
    ):

        def make_rs(probs: bool = probs, temps: list[float] = temps) -> tuple[Any, ...]:
            spec = _spec_inputs(ctx, 31, with_draft_probs=probs)
            greedy = [t == 0.0 for t in temps]
            md = _metadata(
                ctx,
                4,
                temperature=torch.tensor(temps, device=ctx.device),
                all_greedy=all(greedy),
                all_random=not any(greedy),
                generators=_generators(ctx, {0: 3, 3: 9}),
            )
            return (
                spec["draft_token_ids"],
                spec["num_draft_tokens"],
                spec["max_spec_len"],
                spec["cu_num_draft_tokens"],
                spec["draft_probs"],
                spec["target_logits"],
                spec["bonus_token_ids"],
                md,
            )

        out.append(
            Case(
                "rejection",
                f"rejection_sample:{name}",
                make_rs,
                rs.rejection_sample,
                logits_out,
                "requests 0 and 3 seeded",
            )
        )
    return out


# --- one configuration -----------------------------------------------------------------------------------------------


def _cpu(x: Any, torch: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu").clone()
    return x


def bit_equal(torch: Any, a: list[Any] | None, b: list[Any] | None) -> bool:
    """Same length, and each pair the same dtype, shape and bytes (NaN and -0.0 included)."""
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not torch.equal(
                x.contiguous().view(-1).view(torch.uint8), y.contiguous().view(-1).view(torch.uint8)
            ):
                return False
        elif x != y:
            return False
    return True


def _is_native(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return (
        isinstance(exc, vllm_native.NativeStandIn) or "'_C'" in text or "_C::" in text or "stand-in" in text
    )


class Watch:
    """Counts the calls of the functions the series adds (module attribute wrappers: the module's own calls look
    them up as globals at call time, so every call through the module is seen)."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.present: dict[str, bool] = {}

    def install(self, spec: dict[str, list[str]]) -> None:
        for module_name, names in spec.items():
            module = importlib.import_module(module_name)
            for name in names:
                key = f"{module_name}:{name}"
                fn = getattr(module, name, None)
                self.present[key] = callable(fn)
                if not callable(fn):
                    continue

                def counted(*args: Any, __fn: Any = fn, __key: str = key, **kwargs: Any) -> Any:
                    self.calls[__key] += 1
                    return __fn(*args, **kwargs)

                functools.update_wrapper(counted, fn)
                setattr(module, name, counted)


def _import_tree(args: argparse.Namespace) -> tuple[Ctx, dict[str, Any]]:
    os.environ.update(json.loads(args.env or "{}"))
    os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    if args.dry_run:
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    tree = str(Path(args.tree).resolve())
    sys.path.insert(0, tree)
    vllm_native.install(json.loads(args.native or "[]"))
    t0 = time.perf_counter()
    import torch

    base_modules = set(sys.modules)
    t1 = time.perf_counter()
    import vllm

    if not str(Path(vllm.__file__).resolve()).startswith(tree):
        raise SystemExit(
            f"vllm_probes: error: vllm was imported from {vllm.__file__}, not from the tree {tree}"
        )
    from vllm.platforms import current_platform

    ctx = Ctx(torch=torch, device="cpu" if args.dry_run else "cuda", dry_run=args.dry_run, vocab=0)
    ctx.vocab = DRY_VOCAB if args.dry_run else VOCAB
    if args.dry_run and not current_platform.is_cpu():
        raise SystemExit(
            f"vllm_probes: error: the dry run resolved {type(current_platform).__name__}, not the CPU"
        )
    if not args.dry_run and not current_platform.is_cuda():
        raise SystemExit(
            f"vllm_probes: error: vLLM resolved {type(current_platform).__name__} on this machine, not CUDA "
            f"(torch.cuda.is_available() = {torch.cuda.is_available()})"
        )
    for short, name in (
        ("topk_topp_sampler", "vllm.v1.sample.ops.topk_topp_sampler"),
        ("penalties", "vllm.v1.sample.ops.penalties"),
        ("rejection_sampler", "vllm.v1.sample.rejection_sampler"),
        ("sampler", "vllm.v1.sample.sampler"),
        ("metadata", "vllm.v1.sample.metadata"),
        ("logitsprocs", "vllm.v1.sample.logits_processor"),
        ("layers_utils", "vllm.model_executor.layers.utils"),
        ("custom_ops", "vllm._custom_ops"),
    ):
        ctx.m[short] = importlib.import_module(name)
    t2 = time.perf_counter()
    added = set(sys.modules) - base_modules
    from vllm.triton_utils import HAS_TRITON

    info = {
        "platform": type(current_platform).__name__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "has_triton": bool(HAS_TRITON),
        "vllm_file": vllm.__file__,
        "vllm_version": importlib.metadata.version("vllm"),  # what vLLM's platform detection reads
        "import_s": {"torch": round(t1 - t0, 2), "vllm": round(t2 - t1, 2)},
        "imports": {
            "modules": len(added),
            "vllm_modules": sum(1 for n in added if n == "vllm" or n.startswith("vllm.")),
            "markers": {m: any(n == m or n.startswith(m + ".") for n in sys.modules) for m in IMPORT_MARKERS},
        },
        "flags": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith(("VLLM_OVL_", "VLLM_CPU_FORK"))
        },
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if not args.dry_run:
        info["gpu"] = torch.cuda.get_device_name(0)
    return ctx, info


def _seed(torch: Any) -> None:
    torch.manual_seed(1234)


def run_cases(ctx: Ctx, watch: Watch, only: set[str] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    import cuda_census

    torch = ctx.torch
    results: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    inst = cuda_census.instrument(ctx.dry_run, cpu_is_device=True)
    try:
        all_cases = cases(ctx)
    except Exception as exc:
        return {
            "*": {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        }, {}
    for case in all_cases:
        if only is not None and case.key not in only:
            continue
        row: dict[str, Any] = {"key": case.key, "note": case.note, "error": None, "native": False}
        t0 = time.perf_counter()
        watch.calls.clear()
        try:
            _seed(torch)
            first = [_cpu(x, torch) for x in case.outputs(case.call(*case.make()))]
            row["entered"] = dict(watch.calls)
            made = case.make()
            _seed(torch)
            with inst, inst.step(case.name):
                second = case.call(*made)
            second_out = [_cpu(x, torch) for x in case.outputs(second)]
            report = inst.report(tag=case.name)
            row["census"] = {m: report["metrics"].get(m) for m in COMPARED}
            row["sites"] = {m: report["sites"].get(m, [])[:6] for m in ("host-syncs", "eager-launches")}
            row["deterministic"] = bit_equal(torch, first, second_out)
            outputs[case.name] = first
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            row["native"] = _is_native(exc)
            row["traceback"] = traceback.format_exc()[-1500:]
            row.setdefault("entered", dict(watch.calls))
        row["seconds"] = round(time.perf_counter() - t0, 2)
        results[case.name] = row
        print(
            f"vllm_probes: {case.name}: {'ok' if not row['error'] else row['error'][:120]}",
            file=sys.stderr,
            flush=True,
        )
    return results, outputs


# --- the go/no-go timing (0008 on CUDA) ------------------------------------------------------------------------------


@contextlib.contextmanager
def _no_repetition_kernel(custom_ops: Any) -> Iterator[None]:
    """stock's apply_penalties with its repetition-penalty call made a no-op (a labelled lower bound of stock's
    contiguous CUDA path, whose native kernel cannot travel)."""
    original = custom_ops.apply_repetition_penalties
    custom_ops.apply_repetition_penalties = lambda *a, **k: None
    try:
        yield
    finally:
        custom_ops.apply_repetition_penalties = original


def run_timing(ctx: Ctx, rounds: int) -> dict[str, Any]:
    import cuda_census

    torch = ctx.torch
    dense = ctx.m["layers_utils"].apply_penalties
    sparse = getattr(ctx.m["penalties"], "apply_penalties_at_seen_tokens", None)
    if sparse is None:
        return {"error": "this tree has no apply_penalties_at_seen_tokens (is it the patched tree?)"}
    prompt_len, output_len = (64, 32) if ctx.dry_run else (512, 256)
    shapes = (1, 2) if ctx.dry_run else (1, 4, 16)
    out: dict[str, Any] = {
        "vocab": ctx.vocab,
        "prompt": prompt_len,
        "output": output_len,
        "rounds": rounds,
        "by_rows": {},
        "stand_in": "dense_no_repetition_op: stock's apply_penalties with vLLM's repetition-penalty call made a "
        "no-op (its CUDA kernel is native and cannot travel): a lower bound of stock's contiguous path",
    }
    for rows in shapes:
        prompt_t, presence, frequency, repetition, outputs = _penalty_inputs(
            ctx, rows, prompt_len, output_len, 41
        )
        # what apply_all_penalties hands apply_penalties: the outputs as a padded tensor, placeholders -> vocab
        width = max(len(o) for o in outputs)
        out_t = torch.full((rows, width), ctx.vocab, dtype=torch.int64)
        for i, o in enumerate(outputs):
            out_t[i, : len(o)] = torch.tensor(o, dtype=torch.int64)
        out_t.masked_fill_(out_t == -1, ctx.vocab)
        out_t = out_t.to(ctx.device)
        view = _logits(ctx, rows, 43, width=ctx.vocab + 64)[:, : ctx.vocab]
        contiguous = view.contiguous().clone()
        args = (prompt_t, out_t, presence, frequency, repetition)

        def dense_view(view: Any = view, args: tuple[Any, ...] = args) -> Any:
            return dense(view, *args)

        def dense_no_rep(contiguous: Any = contiguous, args: tuple[Any, ...] = args) -> Any:
            with _no_repetition_kernel(ctx.m["custom_ops"]):
                return dense(contiguous, *args)

        def sparse_call(contiguous: Any = contiguous, args: tuple[Any, ...] = args) -> Any:
            return sparse(contiguous, *args)

        fns = {"dense_view": dense_view, "dense_no_repetition_op": dense_no_rep, "sparse_0008": sparse_call}
        row: dict[str, Any] = {}
        # the same logits from both algorithms (on fresh copies): a CUDA variant would be lossless
        a = _logits(ctx, rows, 47, width=ctx.vocab + 64)[:, : ctx.vocab]
        b = a.contiguous().clone()
        row["equal_outputs"] = bit_equal(
            torch, [dense(a, *args).contiguous()], [sparse(b, *args).contiguous()]
        )
        inst = cuda_census.instrument(ctx.dry_run, cpu_is_device=True)
        counts = {}
        for name, fn in fns.items():
            fn()
            with inst, inst.step(name):
                fn()
            metrics = inst.report(tag=name)["metrics"]
            counts[name] = {m: metrics.get(m) for m in ("host-syncs", "eager-launches", "bytes-moved")}
        row["census"] = counts
        samples = cuda_census.timed(inst, fns, rounds=rounds, warmup=3)
        row["median_us"] = {n: round(sorted(s)[len(s) // 2], 2) for n, s in samples.items()}
        row["dense_view_vs_sparse"] = cuda_census.ratio_interval(
            samples["dense_view"], samples["sparse_0008"]
        )
        row["dense_lower_bound_vs_sparse"] = cuda_census.ratio_interval(
            samples["dense_no_repetition_op"], samples["sparse_0008"]
        )
        row["verdict"] = go_no_go(row["dense_lower_bound_vs_sparse"], row["dense_view_vs_sparse"])
        out["by_rows"][str(rows)] = row
        print(
            f"vllm_probes: timing rows {rows}: {row['verdict']} {row['median_us']}",
            file=sys.stderr,
            flush=True,
        )
    return out


def go_no_go(lower: dict[str, Any], fallback: dict[str, Any]) -> str:
    """go: 0008's algorithm beats even a lower bound of stock (its interval above 1); no-go: it loses to stock with
    the slower PyTorch repetition fallback (interval below 1); otherwise inconclusive (between the two)."""
    lo = lower.get("ci")
    fb = fallback.get("ci")
    if lo and lo[0] > 1.0:
        return "go"
    if fb and fb[1] < 1.0:
        return "no-go"
    return "inconclusive"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--tree", required=True, help="a folder holding this configuration's vllm/ package")
    ap.add_argument("--config", required=True, help="stock, flag_off or patched (a label in the report)")
    ap.add_argument(
        "--env", default="{}", help="JSON: environment variables to set first (the series' flags)"
    )
    ap.add_argument("--native", default="[]", help="JSON: the native module names to stand in for")
    ap.add_argument("--watch", default="{}", help="JSON: {module: [function]} the series adds, to count")
    ap.add_argument("--only", action="append", help="only the cases of this probe key (repeatable)")
    ap.add_argument("--timing", action="store_true", help="the 0008 go/no-go timing instead of the cases")
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per function (--timing)")
    ap.add_argument("--dry-run", action="store_true", help="CPU tensors and the CPU census")
    ap.add_argument("--out", type=Path, required=True, help="JSON results")
    ap.add_argument("--outputs", type=Path, help="torch.save of the cases' outputs (for the comparison)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    ctx, info = _import_tree(args)
    doc: dict[str, Any] = {"config": args.config, "dry_run": args.dry_run, "info": info}
    if args.timing:
        doc["timing"] = run_timing(ctx, max(2, args.rounds))
    else:
        watch = Watch()
        watch.install(json.loads(args.watch or "{}"))
        doc["watched"] = watch.present
        results, outputs = run_cases(ctx, watch, set(args.only) if args.only else None)
        doc["cases"] = results
        if args.outputs is not None:
            ctx.torch.save(outputs, args.outputs)
    doc["stood_in"] = vllm_native.stood_in()
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(partial, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
