"""What the device run measures, per engine, and how it fits one H200 in 15 minutes (standard library only: the
engines' device scripts import it in their arm's Python, the driver and the tests import it too).

A ``Probe`` measures the census metrics (cuda_census.py) of one region of an engine in one scenario, in the engine's
own call pattern, for the patches whose ``NNNN-`` stripped name starts with ``patch`` (so renumbering or rewording the
tail of a subject keeps the key; the series is read as it is, never by line numbers). The patch's mechanisms and flags
come from its trailers at run time (``scripts/device_check.py`` resolves them); a probe only says which metrics of
which scenario it can measure. ``NotOnOneGpu`` names what one GPU cannot measure at all (collectives, several ranks),
with the reason; every other declared mechanism of the SGLang and ExLlamaV3 series must have a probe
(tests/census/test_device_plan.py). A probe that cannot run in this device run (it needs a checkpoint or the full GPU
engine, which cannot travel) is still planned, with ``pending`` saying why: the report lists it as not measured with
that reason, never as holding.

Budget (``budget_plan``): one device command may run 10 minutes and the whole session 15 (start-up, transfers and a
rerun included), so the run gets ``DEFAULT_BUDGET_S``; fixed costs (setup, extension builds) are taken first, then the
probes in plan order while their estimate fits, the rest skipped with the reason; the engine scripts check the clock
again before each probe (``Deadline``), since estimates are estimates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

DEFAULT_BUDGET_S = (
    540  # one device command (600 s limit) with a minute to spare; the session's 15 min allow a rerun
)
SETUP_S = 40  # pip install of the carried wheels, `overlay apply` of both series offline, CUDA init
REPORT_S = 10

# --- ExLlamaV3's CUDA extension builds: estimates, calibrated here -------------------------------------------------
# No GPU machine has run them. What was measured (2026-12-04): the CPU seconds (user + system of the compiler and every
# process it ran, from wait4) of one full compile of sample units (nvcc 13.0, sm_90 only, host and device code with
# the flags of upstream's util/cuda_flags.py; the .cpp units with ext.py's -Ofast) on the 2-core development VM (AMD
# EPYC, shared: load average 3-8; CPU seconds rather than wall, which the load inflates by 2-4x; under load 8 the CPU
# seconds themselves came out up to 1.5x higher, bindings.cpp 94.7 at -O1 against 62.1 at load 3), with
# scripts/build_exllamav3_ext.py --compile-check (its report's cpu_seconds; the commands are in
# docs/engines/exllamav3.md). A family's units are alike (the same kernels instantiated for another bit width or
# codebook), so its samples' mean stands for all of them. The device machine has 16 cores (the build runs 14 jobs);
# its per-core speed is taken as this VM's: the largest uncertainty (an estimate, say +-50 %).
# (units in the family, mean CPU seconds of the samples, the samples)
EXL3_UNIT_CPU_S: tuple[tuple[int, float, tuple[str, ...]], ...] = (
    (24, 31.6, ("quant/comp_units/exl3_comp_unit_5_cb0.cu",)),  # exl3_comp_unit_{1..8}_cb{0,1,2}
    (3, 30.1, ("quant/comp_units/exl3_comp_unit_h2.cu",)),
    (12, 6.7, ("quant/comp_units/exl3_gemv_int8_inst_coop_k3.cu",)),  # and exl3_gemv_half_inst
    (9, 8.1, ("quant/comp_units/exl3_gemv_int8_inst_sq_k2.cu",)),
    (11, 16.5, ("quant/comp_units/exl3_moe_coop_inst_k3.cu",)),
    (10, 9.7, ("quant/comp_units/exl3_moe_inst_k5_cb1.cu",)),  # *_cb1, k0_n128/n256_cb1
    (13, 9.1, ("quant/comp_units/exl3_moe_inst_k3_cb2.cu",)),
    (12, 9.1, ("quant/comp_units/exl3_moe_inst_k3_cb2_m32.cu",)),
    (12, 13.1, ("quant/comp_units/exl3_moe_inst_k3_cb2_m64.cu",)),
    (9, 10.7, ("quant/comp_units/quantize_tiles_inst_k5.cu",)),  # and quantize_tiles_frac_inst
    (24, 27.0, ("attention.cu", "hgemm_f16acc.cu")),  # the .cu at the top of the extension
    (17, 26.6, ("quant/exl3_gemm.cu", "quant/exl3_moe_coop.cu")),  # quant/*.cu, cache/, cpu/, turing/
    (7, 15.6, ("generator/gumbel.cu", "generator/sampling_fused.cu", "generator/rep_pen.cu")),
    (6, 18.5, ("parallel/broadcast.cu",)),
    (1, 87.0, ("bindings.cpp",)),
    (10, 21.9, ("libtorch/mlp.cpp", "libtorch/blocksparse_mlp.cpp", "libtorch/gated_rmsnorm.cpp")),
    (14, 6.0, ("hadamard.cpp", "stloader.cpp", "cuda_host.cpp", "generator/strings.cpp")),  # the other .cpp
)
EXL3_BUILD_JOBS = 14
EXL3_LINK_S = 15  # linking the objects with torch's libraries (not measured: no CUDA torch here)
# the units the series makes an incremental build recompile (the changed units, the 11 MoE coop instance units
# including the changed exl3_moe_coop.cuh, bindings.cpp), each measured the same way (load 3)
EXL3_PATCHED_UNIT_CPU_S: tuple[tuple[float, str], ...] = (
    (87.0, "bindings.cpp"),
    (14.1, "generator/gumbel.cu"),
    (16.0, "generator/sampling_fused.cu"),
    (27.8, "libtorch/blocksparse_mlp.cpp"),
    (28.0, "libtorch/mlp.cpp"),
    (11.9, "quant/comp_units/exl3_moe_coop_inst_h1.cu"),
    (13.2, "quant/comp_units/exl3_moe_coop_inst_h2.cu"),
    (13.9, "quant/comp_units/exl3_moe_coop_inst_h3.cu"),
    (16.9, "quant/comp_units/exl3_moe_coop_inst_k1.cu"),
    (16.0, "quant/comp_units/exl3_moe_coop_inst_k2.cu"),
    (16.6, "quant/comp_units/exl3_moe_coop_inst_k3.cu"),
    (16.1, "quant/comp_units/exl3_moe_coop_inst_k4.cu"),
    (16.4, "quant/comp_units/exl3_moe_coop_inst_k5.cu"),
    (16.8, "quant/comp_units/exl3_moe_coop_inst_k6.cu"),
    (16.5, "quant/comp_units/exl3_moe_coop_inst_k7.cu"),
    (14.9, "quant/comp_units/exl3_moe_coop_inst_k8.cu"),
    (28.4, "quant/exl3_moe_coop.cu"),
)


def build_seconds(cpu_seconds: list[float], jobs: int = EXL3_BUILD_JOBS) -> int:
    """A ninja build of units of these CPU seconds on ``jobs`` cores: the longest unit or an even share of the
    total, whichever is longer, plus the link (an estimate: ninja's order and the device's core speed are not
    modelled)."""
    if not cpu_seconds:
        return 0
    return round(max(max(cpu_seconds), sum(cpu_seconds) / jobs) + EXL3_LINK_S)


EXL3_STOCK_BUILD_S = build_seconds([cpu for n, cpu, _ in EXL3_UNIT_CPU_S for _ in range(n)])
EXL3_PATCHED_BUILD_S = build_seconds([cpu for cpu, _ in EXL3_PATCHED_UNIT_CPU_S])
# the correctness checks exllamav3_check.py runs after its probes, while the budget lasts (estimates on one H200)
EXL3_CHECK_S = {"rings": 60, "sampler_kernels": 20}


@dataclass(frozen=True)
class Probe:
    engine: str
    key: str  # the engine script's implementation of it
    patch: str  # name prefix after the NNNN- number
    scenario: str
    metrics: tuple[str, ...]
    seconds: int  # estimate on one H200, all configurations (stock, flag off, flag on) included
    region: str  # what runs, in the engine's words
    pending: str | None = None  # why it cannot run in this device run (planned, reported as not measured)
    baseline: str | None = None  # no patch yet: stock measured alone (why: the gap it sizes); patch is ""


@dataclass(frozen=True)
class NotOnOneGpu:
    engine: str
    patch: str
    metric: str
    reason: str


@dataclass(frozen=True)
class Planned:
    probe: Probe
    run: bool
    reason: str | None = None


@dataclass
class Deadline:
    """The wall clock of one engine script's share of the budget."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def allows(self, estimate: float) -> bool:
        return self.left() >= estimate


NEEDS_SGL_ENGINE = (
    "needs SGLang's GPU engine (sgl_kernel and flashinfer CUDA wheels, several hundred MB, over the "
    "64 MiB carry limit): the region is inside {where}"
)

PROBES: tuple[Probe, ...] = (
    # --- SGLang 0.5.23: the engine's functions called as its step calls them; sgl_kernel cannot travel
    Probe(
        "sglang",
        "topk-topp-sample",
        "sampler-Gumbel-max-sampling-after-the-pytorch-top-k",
        "decode-step-sampled",
        ("eager-launches",),
        15,
        "layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch (the filtered sampling path)",
    ),
    Probe(
        "sglang",
        "future-map-resolve",
        "",
        "decode-step",
        ("host-syncs", "bytes-moved"),
        15,
        "managers.overlap_utils.FutureMap: publish, then resolve_seq_lens_cpu as the overlap scheduler calls it "
        "before each spec decode step (needs_cpu_seq_lens True, as for FlashInfer MHA), behind ~200 us of GPU work "
        "standing in for the verify still in flight: the host wait in fwd_prepare_d2h_stream.synchronize()",
        baseline="S1, the FutureMap host-length sync (docs/engines/sglang.md): sized before any patch is written",
    ),
    Probe(
        "sglang",
        "fp8-lm-head",
        "lm_head-opt-in-FP8-lm_head-from-an-online-per-channe",
        "decode-step",
        ("gemm-bytes", "eager-launches", "peak-memory"),
        35,
        "the lm_head logits of LogitsProcessor for 1/4/8 rows: BF16 matmul vs the FP8 copy made at load "
        "(fp8_lm_head_logits): the GEMM's operand bytes and its time; the draft round reads the same head",
    ),
    Probe(
        "sglang",
        "splitk-fp8-gemm",
        "gemm-split-K-small-M-block-FP8-GEMM-with-fused-activ",
        "decode-step",
        ("eager-launches",),
        40,
        "fp8_utils.dispatch_w8a8_block_fp8_linear's choice for 1..16 rows at DeepSeek/GLM shapes, then the call",
    ),
    Probe(
        "sglang",
        "logits-processor",
        "logits_processor-drop-the-shadowed-should_apply_lm_h",
        "decode-step",
        ("eager-launches",),
        0,
        "LogitsProcessor.forward",
        pending=NEEDS_SGL_ENGINE.format(where="LogitsProcessor.forward of a loaded model"),
    ),
    Probe(
        "sglang",
        "accept-stats",
        "spec-acceptance-histograms-by-temperature-and-worklo",
        "decode-step-spec",
        ("host-syncs",),
        0,
        "SchedulerBatchResultProcessor after a verify (the census's decode-step-spec: the scheduler's whole step of a "
        "speculative decode batch)",
        pending=NEEDS_SGL_ENGINE.format(where="the scheduler's result processing"),
    ),
    Probe(
        "sglang",
        "graph-greedy-verify",
        "spec-capture-the-topk-1-greedy-verify-tail-in-the-ve",
        "spec-verify-step",
        ("eager-launches",),
        0,
        "the verify CUDA graph runner with ChainGreedyVerifyEpilogue as capture tail hook",
        pending=NEEDS_SGL_ENGINE.format(where="the verify CUDA graph runner"),
    ),
    # --- ExLlamaV3 1.6.5: the wheel's own generator / attention code on CUDA with the real extension
    Probe(
        "exllamav3",
        "spec-round",
        "generator-wait-on-a-CUDA-event-instead-of-a-device-w",
        "decode-step",
        ("host-syncs", "eager-launches", "h2d-copies", "pageable-copies"),
        60,
        "Generator.iterate_gen without drafts (probes/spec_round.py on CUDA: real sampler and extension kernels, "
        "stand-in target forward with a GPU workload)",
    ),
    Probe(
        "exllamav3",
        "spec-round",
        "generator-wait-on-a-CUDA-event-instead-of-a-device-w",
        "spec-verify-step",
        ("host-syncs",),
        12,
        "Generator.iterate_gen with the drafts (verify, accept, commit)",
    ),
    Probe(
        "exllamav3",
        "spec-round",
        "generator-one-readback-and-device-side-accept-length",
        "spec-verify-step",
        ("host-syncs", "eager-launches", "h2d-copies"),
        12,
        "Generator.iterate_gen with the drafts",
    ),
    Probe(
        "exllamav3",
        "spec-round",
        "generator-one-host-sync-per-speculative-round-drafts",
        "draft-round",
        ("host-syncs", "eager-launches"),
        12,
        "Generator.iterate_draftmodel_dflash_gen (and the verify after it)",
    ),
    Probe(
        "exllamav3",
        "spec-round",
        "sampler-batched-verify-sampling-with-per-row-seeds",
        "spec-verify-step",
        ("eager-launches", "host-syncs"),
        12,
        "Generator.iterate_gen with the drafts, temperature sampling",
    ),
    Probe(
        "exllamav3",
        "spec-round",
        "generator-block-drafter-interface-for-DFlash-style-d",
        "draft-round",
        ("eager-launches",),
        12,
        "Generator.iterate_draftmodel_dflash_gen (stock vs patched: always on)",
    ),
    Probe(
        "exllamav3",
        "spec-round",
        "model_init-embed_on_device-keeps-the-target-s-token",
        "spec-verify-step",
        ("host-syncs",),
        0,
        "as above with the target's embedding on the device (--embed_on_device)",
    ),
    Probe(
        "exllamav3",
        "spec-round",
        "model_init-embed_on_device-keeps-the-target-s-token",
        "draft-round",
        ("host-syncs",),
        0,
        "as above with the target's embedding on the device (--embed_on_device)",
    ),
    Probe(
        "exllamav3",
        "swa-ring",
        "sliding_attn-zero-copy-modular-window-ring",
        "draft-round",
        ("bytes-moved", "eager-launches", "peak-memory", "capturable"),
        35,
        "SlidingAttention.decode_flash_attn per forward over probes/swa_ring.py's window schedules, real Triton "
        "kernels",
    ),
    Probe(
        "exllamav3",
        "swa-ring",
        "sliding_attn-one-ring-page-table-and-seqlens-upload",
        "draft-round",
        ("h2d-copies", "pageable-copies"),
        0,
        "as above (the page-table and seqlens uploads per forward)",
    ),
    Probe(
        "exllamav3",
        "swa-ring",
        "sliding_attn-persistent-ring-step-tables-capturable",
        "draft-round",
        ("capturable", "pageable-copies"),
        0,
        "as above, and one decode_flash_attn call captured in a CUDA graph after the schedule",
    ),
    Probe(
        "exllamav3",
        "swa-ring",
        "sliding_attn-persistent-ring-step-tables-capturable",
        "spec-verify-step",
        ("eager-launches",),
        0,
        "the swa_ring schedule's DFlash write-backs (write_state_rows): kernels per write-back, per-row copies vs "
        "one index_copy_ per tensor",
        pending="the swa-ring request profiles decode_flash_attn steps under one tag (draft-round); the write-back "
        "needs write_state_rows as its own step list tagged spec-verify-step in exllamav3_check.request_for, and a "
        "bsz > 1 schedule (the device payload runs bsz 1, where the indexed write saves nothing)",
    ),
    Probe(
        "exllamav3",
        "swa-ring-q8",
        "sliding_attn-quantized-Q8-window-ring-for-drafter-la",
        "drafter-load",
        ("peak-memory",),
        20,
        "SlidingAttention.decode_flash_attn with the Q8 ring (swa_ring.py quant [8, 8])",
    ),
    Probe(
        "exllamav3",
        "drafter-memory",
        "dflash-opt-in-forced-drafter-window-for-every-DFlash",
        "drafter-load",
        ("peak-memory",),
        15,
        "the DFlash2 drafter's cache allocated on CUDA at 384K tokens (probes/drafter_model.py)",
    ),
    Probe(
        "exllamav3",
        "drafter-memory",
        "model_init-draft_cache_quant-a-draft-cache-format-of",
        "drafter-load",
        ("peak-memory",),
        0,
        "as above with the draft cache quantized",
        pending="probes/drafter_model.py takes no draft_cache_quant (its payload: arch, layer_types, window, "
        "draft_window, cache_tokens, swa_full, alloc_device); the Q8 ring's bytes are measured by swa-ring-q8",
    ),
    Probe(
        "exllamav3",
        "dflash-input",
        "dflash-embed-only-the-anchor-per-round-keep-the-mask",
        "draft-round",
        ("bytes-moved",),
        0,
        "the DFlash drafter's block input (dflash.py)",
        pending="probes/dflash_input.py runs on CPU only (the target embedding is a torch table stand-in): no CUDA "
        "path to count",
    ),
    Probe(
        "exllamav3",
        "dflash-prefill",
        "dflash-crop-drafter-prefill-K-V-projection-to-the-wi",
        "prefill-chunk",
        ("gemm-bytes",),
        0,
        "the drafter prefill's fc / k / v projections (dflash.py): rows and operand bytes per chunk",
        pending="probes/dflash_prefill.py runs on CPU only (projections are torch stand-ins): no CUDA path to count",
    ),
    Probe(
        "exllamav3",
        "fused-tier",
        "mlp-moe-fused-multi-token-tier-up-to-16-rows",
        "verify-mlp",
        ("eager-launches",),
        0,
        "a 9..16-row verify forward through the MoE/MLP fused tier",
        pending="needs an EXL3 MoE checkpoint on the GPU and a third full extension build (EXL3_OVL_BSZN=16's "
        "-DEXL3_OVL_MAX_BSZN=16 goes into every unit's flags, so ninja recompiles all 194 units, ~263 s estimated, "
        "though only 3 read it): over the 15-minute budget",
    ),
    Probe(
        "exllamav3",
        "drafter-graph",
        "generator-the-block-drafter-s-whole-round-as-one-CUD",
        "draft-round",
        ("eager-launches", "graph-launches", "capturable"),
        0,
        "the block drafter's whole round captured (propose_block)",
        pending="needs a real DFlash drafter forward on CUDA (probes/drafter_graph.py is a CPU model of capture)",
    ),
    Probe(
        "exllamav3",
        "drafter-graph",
        "generator-capture-window-ring-drafters-rounds-in-the",
        "draft-round",
        ("eager-launches", "capturable"),
        0,
        "a window-ring drafter's whole round captured",
        pending="needs a real DFlash drafter forward on CUDA (probes/drafter_graph.py is a CPU model of capture)",
    ),
    Probe(
        "exllamav3",
        "mtp-share",
        "mla_attn-share-the-MTP-head-s-DSA-selection-across-d",
        "draft-round",
        ("gemm-bytes", "eager-launches"),
        0,
        "MTP depths >= 1 of a DSA model: the indexer's reads, and the launches with the BC graph on and off",
        pending="needs a GLM-5-style MTP checkpoint (none can be made here)",
    ),
)

NOT_ON_ONE_GPU: tuple[NotOnOneGpu, ...] = (
    NotOnOneGpu(
        "sglang",
        "spec-broadcast-the-verify-outputs-as-one-packed-buff",
        "collectives",
        "tensor-parallel broadcasts: one GPU has one rank",
    ),
    NotOnOneGpu(
        "sglang",
        "allreduce-fuse-AR-residual-RMSNorm-group-FP8-quant",
        "eager-launches",
        "the fusion is inside FlashInfer's TRT-LLM all-reduce: >= 2 SM100 GPUs",
    ),
    NotOnOneGpu(
        "sglang",
        "spec-skip-the-PP-tail-draft-seq-lens-D2H-when-no-dra",
        "host-syncs",
        "the PP tail rank exists only with pipeline parallelism (>= 2 GPUs)",
    ),
)


def probes(engine: str) -> tuple[Probe, ...]:
    return tuple(p for p in PROBES if p.engine == engine)


def slug(name: str) -> str:
    """A patch file name without its ``NNNN-`` number and ``.patch``."""
    stem = name[:-6] if name.endswith(".patch") else name
    return stem[5:] if len(stem) > 5 and stem[:4].isdigit() and stem[4] == "-" else stem


def _prefix_match(prefix: str, name: str) -> bool:
    return slug(name).startswith(prefix)


def probe_for(engine: str, patch_name: str, metric: str, scenario: str) -> Probe | None:
    """The probe planned for one declared mechanism of the patch ``patch_name`` (None: none)."""
    for p in PROBES:
        if (
            p.engine == engine
            and p.baseline is None
            and _prefix_match(p.patch, patch_name)
            and p.scenario == scenario
            and metric in p.metrics
        ):
            return p
    return None


def not_on_one_gpu(engine: str, patch_name: str, metric: str) -> NotOnOneGpu | None:
    for n in NOT_ON_ONE_GPU:
        if n.engine == engine and _prefix_match(n.patch, patch_name) and n.metric == metric:
            return n
    return None


def budget_plan(engine: str, budget_s: float, *, keys: set[str] | None = None) -> list[Planned]:
    """The engine's probes in plan order (each key once), run while their estimates fit ``budget_s``."""
    out: list[Planned] = []
    seen: set[str] = set()
    left = budget_s
    for p in probes(engine):
        if p.key in seen:
            continue
        seen.add(p.key)
        if keys is not None and p.key not in keys:
            out.append(Planned(p, False, "not asked (--only)"))
        elif p.pending:
            out.append(Planned(p, False, f"pending: {p.pending}"))
        elif p.seconds > left:
            out.append(
                Planned(
                    p,
                    False,
                    f"over budget: needs ~{p.seconds} s, {max(0, int(left))} s left of {int(budget_s)} s",
                )
            )
        else:
            left -= p.seconds
            out.append(Planned(p, True))
    return out


def split_budget(total_s: float, *, vllm: bool = True) -> dict[str, float]:
    """Seconds per phase of one device run. The ExLlamaV3 extension builds run in the background while SGLang
    measures (nvcc takes the CPU cores, the SGLang probes the GPU), so ExLlamaV3's probes get what is left after
    the longer of the two. vLLM's check (``vllm``: whether it runs) follows SGLang's on the GPU while the builds
    are still running: it takes the GPU's idle time before ExLlamaV3's probes, and costs them time only where SGLang
    and vLLM together outlast the builds (not at the default budget: ``vllm_fits_beside_the_builds``)."""
    sglang_s = float(sum(p.seconds for p in probes("sglang") if not p.pending)) + 30
    build_s = float(EXL3_STOCK_BUILD_S + EXL3_PATCHED_BUILD_S)
    left = total_s - SETUP_S - REPORT_S
    sglang_s = min(sglang_s, max(0.0, left))
    vllm_s = min(float(VLLM_S), max(0.0, left - sglang_s)) if vllm else 0.0
    return {
        "setup": SETUP_S,
        "sglang": sglang_s,
        "exllamav3_build": min(build_s, max(0.0, left)),
        "exllamav3": max(0.0, left - max(sglang_s + vllm_s, build_s)),
        "report": REPORT_S,
        "total": total_s,
        "vllm": vllm_s,
    }


SESSION_S = 900  # the device session: every call, start-up, transfers and idle time together
MACHINE_START_S = 120  # a fresh machine's start ("minutes"; counted against the session)
CALL_TRANSFER_S = 30  # per call: the working tree copied there, $OUT back (device time, outside the command)


def exl3_schedule(total_s: float = DEFAULT_BUDGET_S) -> dict[str, object]:
    """Where ExLlamaV3's extension builds and probes fit the device session, from the estimates above.

    Call 1 is the driver with both engines (``total_s``): the builds run in the background beside SGLang's probes for
    ``split_budget``'s ``exllamav3_build`` seconds; ExLlamaV3's probes get what is left after them. A build that does not
    finish is stopped with its ninja folder kept (build/device/exllamav3 on the warm machine). Call 2, on the same warm
    machine within the session (``scripts/device/exllamav3_check.sh --phase all --resume``, docs/engines/exllamav3.md),
    finishes the builds (ninja resumes; an arm built from the same sources is skipped), carries over what call 1
    measured and gives the remaining probes and the correctness checks the rest.
    ``fits`` says whether every runnable probe and check (all their configurations) fits the two calls together
    (call 2 run with ``--resume``); what does not fit is skipped with the reason, in plan order."""
    split = split_budget(total_s)
    build = EXL3_STOCK_BUILD_S + EXL3_PATCHED_BUILD_S
    first_build = min(float(build), split["exllamav3_build"])
    first_probes = split["exllamav3"]
    second_total = max(
        0.0, min(float(DEFAULT_BUDGET_S), SESSION_S - MACHINE_START_S - total_s - 2 * CALL_TRANSFER_S)
    )
    second_build = max(0.0, build - first_build)
    second_probes = max(0.0, second_total - SETUP_S - REPORT_S - second_build)
    needed = sum(p.seconds for p in probes("exllamav3") if not p.pending) + sum(EXL3_CHECK_S.values())
    return {
        "build_estimate_s": {"stock": EXL3_STOCK_BUILD_S, "patched": EXL3_PATCHED_BUILD_S},
        "probes_needed_s": needed,
        "call1": {"seconds": total_s, "build_s": first_build, "probes_s": first_probes},
        "call2": {"seconds": second_total, "build_s": second_build, "probes_s": second_probes},
        # call 2 with --resume runs only what call 1 left: the two calls' probe time adds up
        "fits": first_probes + second_probes >= needed,
        "builds_finish": second_build <= max(0.0, second_total - SETUP_S - REPORT_S),
    }


# --- vLLM 0.32.0 (scripts/device/vllm_check.py) ----------------------------------------------------------------------
# The CUDA wheel (326.5 MB) cannot travel; its Python files that the probes import do (scripts/device/vllm_prepare.py:
# the import closure of the probed modules, stock and the series' changes, with the pure-Python and small native
# dependencies the GPU image lacks, as compressed archives), and each native module is a labelled stand-in
# (scripts/device/vllm_native.py). The series' sampling patches gate themselves to the CPU path, so on CUDA the patched
# functions must equal stock: the probes run the real functions on CUDA tensors in three configurations (stock,
# patched without flags, patched with every flag of the series), compare the outputs bit for bit and the census
# counts, and count every entry into a function the series adds (none may be entered on CUDA). One more measurement
# is a go/no-go for a CUDA variant of 0008, timed and reported, never gated.
#
# Estimate on one H200 (not yet run there): three arm processes at once (vLLM's import ~10 s each beside the ExLlamaV3
# build's compilers, Triton compiles of the sampler, rejection and expand kernels, 14 cases counted once each under
# the profiler), then one timing process (import, 3 x 2 shapes x 30 interleaved calls): ~90 s measured as a sum of
# those parts on nothing, so the share is that with a margin.
VLLM_S = 150


@dataclass(frozen=True)
class VllmProbe:
    key: str  # vllm_probes.py's cases carry this key
    patches: tuple[str, ...]  # the patches (name prefixes after NNNN-) whose CUDA side it checks
    region: str
    pending: str | None = None  # why it cannot run in this device run (planned, reported as not measured)


@dataclass(frozen=True)
class CpuPathOnly:
    """A vLLM patch whose change is off the CUDA path: its declared mechanisms are CPU-census claims, which the GPU
    cannot measure; the device checks instead that CUDA takes stock's path (``probe``), where a probe can run."""

    patch: str  # name prefix after NNNN-
    gate: str  # what keeps CUDA out, in the patch's own terms
    probe: str | None  # the VllmProbe key that checks CUDA is unchanged


_NATIVE_IMPORT = (
    "needs {module} imported on CUDA, and its import asks the native _C_stable_libtorch (which cannot travel: 78.8 MB, "
    "54.4 MB at xz -9e, over the 64 MiB carry limit) {why}"
)

VLLM_PROBES: tuple[VllmProbe, ...] = (
    VllmProbe(
        "imports",
        (
            "engine-keep-the-OpenAI-protocol-modules-out-of-the-e",
            "compilation-import-Inductor-when-something-is-compil",
        ),
        "the modules the probed functions' import pulls in on the CUDA platform (vllm.*, torch._inductor, the OpenAI "
        "protocol stack): the same import chain (vllm.config -> vllm.reasoning -> vllm.entrypoints) that the engine's "
        "cold start runs",
    ),
    VllmProbe(
        "sampler",
        (
            "sample-top-p-over-the-top-k-candidates-on-the-PyTorc",
            "sample-top-p-alone-from-the-largest-values-on-the-Py",
        ),
        "topk_topp_sampler.apply_top_k_top_p (CUDA's dispatch: Triton), apply_top_k_top_p_pytorch (CUDA without "
        "Triton), TopKTopPSampler.forward_native with seeded generators, Sampler.forward (penalties, temperature, "
        "top-k/top-p, sampling)",
    ),
    VllmProbe(
        "penalties",
        ("sample-penalties-at-the-tokens-seen-not-over-the-voc",),
        "penalties.apply_all_penalties on CUDA logits: contiguous (vLLM's CUDA repetition kernel, a native op: not "
        "measured) and a non-contiguous view (vLLM's own PyTorch fallback for the repetition penalty)",
    ),
    VllmProbe(
        "rejection",
        (
            "cpu-expand-the-rejection-sampler-s-per-request-value",
            "rejection-sampler-a-recovered-token-only-at-a-reques",
        ),
        "rejection_sampler.expand_batch_to_tokens (float32, int32, int64), apply_sampling_constraints, "
        "rejection_sample with and without draft probabilities, seeded and mixed greedy rows",
    ),
    VllmProbe(
        "penalties-timing",
        (),
        "layers.utils.apply_penalties (stock's dense [rows, vocab + 1] counts) vs 0008's "
        "apply_penalties_at_seen_tokens on CUDA at a 151936 vocabulary, interleaved: a go/no-go for a CUDA variant of "
        "0008, reported, never gated",
    ),
    VllmProbe(
        "generator-rewind",
        ("worker-rewind-a-CPU-generator-by-its-state-when-a-pr",),
        "GPUModelRunner.sample_tokens / _bookkeeping_sync with a CUDA generator (offset rewind)",
        pending=_NATIVE_IMPORT.format(
            module="vllm.v1.worker.gpu_model_runner",
            why="for CUTLASS support (quantization/utils/w8a8_utils.py:41, "
            "torch.ops._C.cutlass_scaled_mm_supports_block_fp8: measured under torch 2.11.0+cu130)",
        ),
    ),
    VllmProbe(
        "draft-kv-group",
        ("worker-a-draft-model-takes-the-attention-metadata-of",),
        "GPUModelRunner's draft-model proposer given its own KV cache group's attention metadata (a hybrid target "
        "whose group 0 is not the draft's layers)",
        pending=_NATIVE_IMPORT.format(
            module="vllm.v1.worker.gpu_model_runner",
            why="for CUTLASS support (quantization/utils/w8a8_utils.py:41), and the case needs a hybrid target and a "
            "draft model on the GPU",
        ),
    ),
    VllmProbe(
        "kv-alloc",
        ("worker-map-the-CPU-KV-cache-from-zero-pages-instead-",),
        "v1.worker.utils.allocate_kv_cache on a CUDA device",
        pending="needs vllm.v1.worker.utils imported on CUDA, which imports the model layers (mamba, attention) whose "
        "import queries the GPU and Triton at import time: its import closure could not be established without a GPU, "
        "so it is not in the carried trees",
    ),
)

VLLM_CPU_PATH_ONLY: tuple[CpuPathOnly, ...] = (
    CpuPathOnly(
        "cpu-fork-the-engine-core-and-the-CPU-workers-where-t",
        "VLLM_CPU_FORK_WORKERS and the CPU worker (cpu_worker.py, the CPU executor's start)",
        None,
    ),
    CpuPathOnly(
        "triton_utils-rebind-kernel-overrides-without-reading",
        "register_kernels, which only CpuPlatform calls (platforms/cpu.py)",
        None,
    ),
    CpuPathOnly(
        "worker-map-the-CPU-KV-cache-from-zero-pages-instead-",
        'device.type == "cpu" in allocate_kv_cache',
        "kv-alloc",
    ),
    CpuPathOnly(
        "sample-top-p-over-the-top-k-candidates-on-the-PyTorc",
        "allow_cpu_sync (current_platform.is_cpu() in apply_top_k_top_p), and only without Triton",
        "sampler",
    ),
    CpuPathOnly(
        "sample-top-p-alone-from-the-largest-values-on-the-Py",
        "allow_cpu_sync (current_platform.is_cpu() in apply_top_k_top_p), and only without Triton",
        "sampler",
    ),
    CpuPathOnly("sample-penalties-at-the-tokens-seen-not-over-the-voc", "not logits.is_cuda", "penalties"),
    CpuPathOnly(
        "cpu-expand-the-rejection-sampler-s-per-request-value", 'x.device.type == "cpu"', "rejection"
    ),
    CpuPathOnly(
        "rejection-sampler-a-recovered-token-only-at-a-reques",
        'target_probs.device.type == "cpu"',
        "rejection",
    ),
    CpuPathOnly(
        "cpu-roll-the-gated-delta-conv-window-by-the-request-",
        "the CPU gated-delta ops (model_executor/layers/mamba/ops/cpu/gdn_attention.py), which only the CPU platform "
        "calls; CUDA rolls the window in its own Triton kernel",
        None,
    ),
    CpuPathOnly(
        "worker-rewind-a-CPU-generator-by-its-state-when-a-pr",
        'gen.device.type == "cpu" (a CUDA generator takes stock\'s offset rewind)',
        "generator-rewind",
    ),
)


def vllm_probe(key: str) -> VllmProbe | None:
    return next((p for p in VLLM_PROBES if p.key == key), None)


def vllm_probes_for(patch_name: str) -> list[VllmProbe]:
    """The vLLM probes that check this patch's CUDA side."""
    return [p for p in VLLM_PROBES if any(_prefix_match(prefix, patch_name) for prefix in p.patches)]


def vllm_cpu_path_only(patch_name: str) -> CpuPathOnly | None:
    return next((c for c in VLLM_CPU_PATH_ONLY if _prefix_match(c.patch, patch_name)), None)


def vllm_fits_beside_the_builds(total_s: float = DEFAULT_BUDGET_S) -> bool:
    """Whether SGLang's and vLLM's GPU time end before the ExLlamaV3 builds' estimate (then vLLM costs the run
    nothing: ExLlamaV3's probes start when the builds end either way)."""
    split = split_budget(total_s)
    return split["sglang"] + split["vllm"] <= split["exllamav3_build"]
