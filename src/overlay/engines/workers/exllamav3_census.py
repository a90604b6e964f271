"""ExLlamaV3 mechanism census on CPU (runs inside an exllamav3 arm with the labelled stand-in extension).

Request on stdin: a CensusRequest (overlay/schemas/documents.py): {"task": "census", "model": str (unused: no EXL3
checkpoint runs on CPU), "scenario": "decode-step"|"spec-verify-step"|"draft-round"|"prefill-chunk" (the drafter's
prefill K/V update: workers/exllamav3_census_prefill.py, which describes it)|"drafter-load" (model_init's caches:
workers/exllamav3_census_load.py)|"verify-mlp" (the target's MLP over a verify forward's rows:
workers/exllamav3_census_mlp.py), "steps": int, "drafter_layers":
"ring"|"paged" ("ring"), "ring_bits": [k_bits, v_bits] (optional, ring drafters: the rings quantized as
--draft_cache_quant makes them with EXL3_OVL_SWA_RING=1, Cache(swa_ring_bits=...), patch 0008; its row writes run
the quant kernel's CPU reference), "bsz": int (optional, default 2), "options": {"--embed_on_device": null} (the only
model_init option the census runs)}; the patch's flag comes as environment variables of this process. Fixed inputs:
K 7 drafts (block 8), the "temp" sampler, the real Embedding module placed by the loader's rule (model_ls.py: system
RAM unless --embed_on_device).
Response on stdout: {"scenario", "steps", "metrics": {metric: value per step, "capturable": true|false|null},
"sites": {metric: [["path:line", count], ...]}, "notes": [str], "standin": str}.

What runs: the wheel's own Generator.iterate_gen (decode and verify: sampling, accept, commit, the readback and the
waits), Generator.iterate_draftmodel_dflash_gen (the drafter round's generator side), Job.receive_logits /
get_input_ids_list / is_prefill_done and the samplers, driven by the exllamav3 probe tests/engines/exllamav3/probes/
spec_round.py. What is stood in (and so counts the same in both arms): the generator object and the jobs' pages, the
target model's forward (logits from a fixed table; an EXL3 forward needs the CUDA kernels), the drafter's forward, the
CUDA extension (each call of an extension function is counted as one eager launch; its CPU references are numpy, so
their own work is invisible) and the pinned staging buffers (plain host tensors). Device tensors are
``_devsim.CensusDev`` (CPU memory answering is_cuda, device cpu:0); the census counts with ``placement="is_cuda"``.

Capturability: the engine's ``torch.cuda.graph`` / ``CUDAGraph.capture_begin`` regions are census capture regions
(torch_census emulates them). A region that calls the target's stood-in forward (``STANDIN_CALLS[:1]``; the census's drafter is the wheel's DFlashInputLayer over the target's real Embedding, then device-only ops, so a region around it is judged) cannot be judged, since the stand-in's work is not the real forward's, so ``capturable`` is then not measured; a region
made only of the wheel's own code is measured (False at its first host read, data-dependent shape or pageable copy).
With the ring drafter two pieces of the wheel's ring code run in capture-check regions (judged like a capture region,
their ops still counted as eager launches): each layer's ``_decode_state_prep`` (draft-round) and each layer's
``write_state_rows`` (spec-verify-step: the DFlash write-back after verify); the write-back's plan is taken from the
host's positions before it (update_kv_from_target's ``cache_seqlens.tolist()``), outside the region.

Replays: torch_census's emulated CUDAGraph records the captured region's device ops and re-runs them at
``replay()`` (counted as graph-launches), so a captured round's launches and its replays' outputs are modelled; a
replayed region that called the stand-in extension (whose numpy work a replay does not redo) is not, and its launch
counts are then reported as not measured.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from census_sites import census_record, judged_flags

if TYPE_CHECKING:
    from overlay.schemas.documents import CensusRequest

REPO = Path(__file__).resolve().parents[4]
PROBES = REPO / "tests" / "engines" / "exllamav3" / "probes"
SCENARIOS = {"decode-step": "decode", "spec-verify-step": "verify", "draft-round": "draft"}
STANDIN = (
    "the generator object, jobs and pages, the target forward after its real Embedding, the drafter's "
    "projections, attention and head (device ops; ring layers' state side is the wheel's), the CUDA extension "
    "(stand-in; one call = one launch)"
)
WARMUP = 1  # the first step of each kind allocates staging buffers; it is left out of the means
# the census's fixed inputs (spec_round payload): batch size, drafter block (K = BLOCK - 1), sampler, embedding table
BSZ, BLOCK, SAMPLER, EMBED = 2, 8, "temp", "loader"
FLAG_PREFIX = "EXL3_OVL_"
# model_init options the census applies itself, through the wheel's own function for them (model_init.embed_on_device
# on the real Embedding module, before the loader's placement rule)
LOADER_OPTIONS = ("--embed_on_device",)
NOT_COUNTED = {
    "peak-memory": "the caches are allocated at load, outside the steps (scenario drafter-load counts them)",
    "collectives": "no tensor-parallel path runs on CPU",
    "cache-hits": "no engine cache entry point is wrapped by the census",
}
# draft-round launches: the wheel's generator round, the target's real Embedding (the drafter's input layer embeds the
# anchor through it), for "ring" the wheel's SlidingAttention state side; the drafter's projections, attention and
# head are stand-in device ops (the same in every arm)
DRAFTER_OPS = "the drafter's projections, attention and head are stand-in device ops, the same in every arm"
# the stood-in forwards, as (generator attribute, method): called inside a capture region, they make it unjudgeable
STANDIN_CALLS = (
    ("model", "forward"),
    ("draft_model", "forward"),
    ("draft_model", "sample_from_state"),
    ("draft_model", "propose_block"),
)


class _RecordingEnviron(os._Environ):  # type: ignore[type-arg]
    """os.environ that remembers which EXL3_OVL_* switches the engine read (the patched code reads them per call)."""

    read: set[str] = set()  # noqa: RUF012 (shared by every instance on purpose)

    def __getitem__(self, key: str) -> str:
        if key.startswith(FLAG_PREFIX):
            _RecordingEnviron.read.add(key)
        value: str = super().__getitem__(key)
        return value


def census(request: CensusRequest) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(PROBES))
    os.environ.setdefault("EXL3_FUSED_SAMPLER", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import _devsim
    import spec_round
    from torch_census import Census

    if request["scenario"] == "prefill-chunk":  # the drafter's prefill K/V update: its own module
        from exllamav3_census_prefill import prefill_chunk

        return prefill_chunk(request, environ=_RecordingEnviron, options=dict(request.get("options") or {}))
    if request.get("drafter") == "mtp":  # an MTP drafter's round (workers/exllamav3_census_mtp.py)
        from exllamav3_census_mtp import mtp_round

        return mtp_round(
            request,
            census_cls=Census,
            dev_cls=_devsim.CensusDev,
            environ=_RecordingEnviron,
            skip=(_devsim.__file__,),
        )
    if request["scenario"] == "drafter-load":  # model_init's caches (workers/exllamav3_census_load.py)
        from exllamav3_census_load import load_census

        return load_census(request, Census, _devsim.CensusDev, _RecordingEnviron, (_devsim.__file__,))
    if request["scenario"] == "verify-mlp":  # the target's MLP over verify rows (exllamav3_census_mlp.py)
        from exllamav3_census_mlp import verify_mlp

        return verify_mlp(request, environ=_RecordingEnviron, options=dict(request.get("options") or {}))
    options = dict(request.get("options") or {})
    embed_on_device = "--embed_on_device" in options
    options.pop("--embed_on_device", None)
    if options:
        raise SystemExit(
            f"exllamav3 census: CLI options {sorted(options)} are model_init/loader switches the CPU "
            f"census does not run (it runs only {', '.join(LOADER_OPTIONS)}: not measured)"
        )
    scenario = request["scenario"]
    if scenario not in SCENARIOS:
        raise SystemExit(
            f"exllamav3 census: unknown scenario {scenario!r}; expected one of {', '.join(SCENARIOS)}"
        )
    steps = int(request["steps"])

    import exllamav3.ext as ext_mod
    from exllamav3.generator import generator as gen_mod

    standin = ext_mod.exllamav3_ext
    _devsim.dev = lambda t: t.as_subclass(_devsim.CensusDev)  # the census's device spelling (cpu:0)
    spec_round.install_cuda_mocks = lambda: None  # the census stands in for torch.cuda itself
    spec_round.PIN_STAGING = (
        True  # the generator's staging buffers are pinned, as on CUDA (the census emulates it)
    )
    c = Census(placement="is_cuda", device_class=_devsim.CensusDev, skip=(_devsim.__file__,))
    original = {
        name: getattr(gen_mod.Generator, name) for name in ("iterate_gen", "iterate_draftmodel_dflash_gen")
    }
    captured_standins: dict[
        str, set[str]
    ] = {}  # step tag -> the stood-in forwards called inside a capture region

    # the census's drafter embeds through the target's real Embedding module and is device-only ops after that (no
    # host read, no hidden transfer: the census sees them), so a capture region around it is judged; a capture
    # region around the target's stand-in forward is not
    unjudged = STANDIN_CALLS[:1]

    def guard(gen: Any, tag: str) -> None:
        for owner_name, method in unjudged:
            owner = getattr(gen, owner_name, None)
            fn = getattr(owner, method, None)
            if fn is None:
                continue
            inner = getattr(fn, "_census_inner", fn)

            def guarded(
                *args: Any, _fn: Any = inner, _what: str = f"{owner_name}.{method}", **kwargs: Any
            ) -> Any:
                if c._capture_depth:
                    captured_standins.setdefault(current_tag[0], set()).add(_what)
                return _fn(*args, **kwargs)

            guarded._census_inner = inner  # type: ignore[attr-defined]
            setattr(owner, method, guarded)
        current_tag[0] = tag

    current_tag = [""]

    def stepped(name: str) -> Any:
        fn = original[name]

        def run(gen: Any, results: Any, *args: Any, **kwargs: Any) -> Any:
            drafts = args[0] if args else kwargs.get("draft_tokens")
            tag = (
                "draft"
                if name == "iterate_draftmodel_dflash_gen"
                else ("decode" if drafts is None else "verify")
            )
            before = standin.calls.copy()
            guard(gen, tag)
            with c.step(tag):
                out = fn(gen, results, *args, **kwargs)
                for kernel, n in (standin.calls - before).items():
                    c.count(
                        "eager-launches", n, kind=f"exllamav3_ext.{kernel}", site=f"exllamav3_ext.{kernel}"
                    )
            return out

        return run

    ring_bits = _ring_bits(request)
    bsz = int(request.get("bsz", BSZ))
    if not 1 <= bsz <= 8:
        raise SystemExit(f"exllamav3 census: bsz {bsz} out of range; expected 1..8")
    payload: dict[str, Any] = {
        "seed": 11,
        "bsz": bsz,
        "block": BLOCK,
        "rounds": steps + WARMUP,
        "decode_rounds": steps + WARMUP if scenario == "decode-step" else 0,
        "sampler": SAMPLER,
        "embed": EMBED,
        "corrupt": 20,
        "embed_on_device": embed_on_device,
        "drafter_layers": request.get("drafter_layers", "ring"),
        "device_drafter": True,
    }
    if ring_bits:
        payload["ring_bits"] = ring_bits
    if scenario == "decode-step":
        payload["rounds"] = 0
    for name in original:
        setattr(gen_mod.Generator, name, stepped(name))
    captured_ext = _watch_captured_calls(c, standin)
    ring_prep = ring_write = None
    if payload["drafter_layers"] == "ring":
        # the wheel's per-layer ring step of the drafter forward and its per-layer write-back (the DFlash
        # update_kv_from_target's write_state_rows, in spec-verify-step), each judged for capturability
        # (capture_check: their ops still count as eager launches; no engine region captures them here)
        from exllamav3.modules.sliding_attn import SlidingAttention

        ring_prep = SlidingAttention._decode_state_prep
        ring_write = SlidingAttention.write_state_rows

        def checked_prep(self: Any, *args: Any, **kwargs: Any) -> Any:
            with c.capture_check():
                return ring_prep(self, *args, **kwargs)

        def checked_write(self: Any, *args: Any, **kwargs: Any) -> Any:
            with c.capture_check():
                return ring_write(self, *args, **kwargs)

        checked_prep.__wrapped__ = ring_prep  # type: ignore[attr-defined]  # its signature (the probe reads it)
        SlidingAttention._decode_state_prep = checked_prep
        SlidingAttention.write_state_rows = checked_write
    plain_environ = os.environ.__class__
    os.environ.__class__ = _RecordingEnviron
    try:
        with c:
            spec_round.case(payload)
    finally:
        os.environ.__class__ = plain_environ
        for name, fn in original.items():
            setattr(gen_mod.Generator, name, fn)
        if ring_prep is not None:
            SlidingAttention._decode_state_prep = ring_prep
        if ring_write is not None:
            SlidingAttention.write_state_rows = ring_write
    report = c.report(tag=SCENARIOS[scenario], skip=WARMUP)
    metrics = dict(report["metrics"])
    not_counted = dict(NOT_COUNTED)
    for metric in not_counted:
        metrics[metric] = None
    if "graph-replays" in report["kinds"] and captured_ext:
        # a replay re-runs the captured aten ops only: the stand-in extension's numpy work inside the region is not
        # redone, so the replayed outputs (and an engine's validation of them) are not the real graph's
        for metric in ("eager-launches", "graph-launches"):
            metrics[metric] = None
            not_counted[metric] = (
                f"a replayed capture region called the stand-in extension ({', '.join(sorted(captured_ext))}), "
                "whose numpy work the census's graph replay does not redo"
            )
    standins = sorted(captured_standins.get(SCENARIOS[scenario], ()))
    if standins:
        metrics["capturable"] = None
        not_counted["capturable"] = (
            f"a capture region calls the stood-in {', '.join(standins)}, whose work is not the real forward's"
        )
    placement = {
        "loader": "the real Embedding placed by the loader's rule"
        + (" after --embed_on_device" if embed_on_device else ""),
        "host": "a host table",
        "device": "a device table",
    }
    notes = [
        (
            f"bsz {payload['bsz']}, K {payload['block'] - 1}, sampler {payload['sampler']}, embedding: "
            f"{placement.get(payload['embed'], payload['embed'])}; {report['steps']} steps after {WARMUP} warm-up"
        )
    ]
    flagged, metrics = judged_flags(
        FLAG_PREFIX,
        _RecordingEnviron.read,
        "on this scenario's CPU path (the patch's code is in a module the census does not run: the EXL3 model "
        "forward is stood in)",
        metrics,
    )
    notes += flagged
    if scenario == "draft-round":
        notes.append(f"drafter: {payload['drafter_layers']} layers; {DRAFTER_OPS}")
    if ring_bits:
        notes.append(
            f"drafter rings quantized ({ring_bits[0]},{ring_bits[1]} bits, swa_ring_bits); "
            "quant_cache_paged is a CPU reference (one call = one launch)"
        )
    notes += [f"{m}: not counted ({why})" for m, why in not_counted.items()]
    if report["violations"]:
        notes.append("capture violations: " + "; ".join(report["violations"][:5]))
    return census_record(
        scenario, report, metrics, notes, standin=STANDIN, detail={"violations": report["violations"][:5]}
    )


def _ring_bits(request: Any) -> list[int] | None:
    """The request's "ring_bits" (checked): a quantized ring needs ring drafter layers, the modular ring
    (EXL3_OVL_SWA_RING=1) and a wheel with 0008's SWALayerState_quant."""
    bits = request.get("ring_bits")
    if bits is None:
        return None
    if (
        not isinstance(bits, list)
        or len(bits) != 2
        or not all(isinstance(b, int) and 2 <= b <= 8 for b in bits)
    ):
        raise SystemExit(f"exllamav3 census: ring_bits {bits!r}; expected [k_bits, v_bits], each 2..8")
    if request.get("drafter_layers", "ring") != "ring":
        raise SystemExit("exllamav3 census: ring_bits needs drafter_layers 'ring' (quantized window rings)")
    if os.environ.get("EXL3_OVL_SWA_RING") != "1":
        raise SystemExit(
            "exllamav3 census: ring_bits needs EXL3_OVL_SWA_RING=1 (a quantized window ring is a modular ring)"
        )
    from exllamav3.modules import sliding_attn

    if not hasattr(sliding_attn, "SWALayerState_quant"):
        raise SystemExit(
            "exllamav3 census: ring_bits: this wheel has no quantized window ring (SWALayerState_quant, patch 0008)"
        )
    return list(bits)


def _watch_captured_calls(c: Any, standin: Any) -> set[str]:
    """The names of the stand-in extension's functions called while the census records a capture region (filled as
    the census runs; the wrappers are undone when it exits)."""
    seen: set[str] = set()
    for name, fn in list(vars(standin).items()):
        if name.startswith("_") or not isinstance(fn, types.FunctionType):
            continue

        def watched(*args: Any, _fn: Any = fn, _name: str = name, **kwargs: Any) -> Any:
            if c._tape is not None:
                seen.add(_name)
            return _fn(*args, **kwargs)

        c._patch(standin, name, watched)
    return seen


def main() -> None:
    request = json.loads(sys.stdin.read() or "{}")
    if request.get("task") != "census":
        raise SystemExit(f"exllamav3_census: unknown task {request.get('task')!r}; expected 'census'")
    sys.stdout.write(json.dumps(census(request), sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
