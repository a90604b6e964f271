"""The torch census inside SGLang's scheduler process (test infrastructure for `overlay check --mechanism`).

sglang_worker.py's ``census`` task starts the CPU engine with a throwaway folder on PYTHONPATH holding an
``overlay_census`` distribution whose ``sglang.srt.plugins`` entry point is ``register`` below; SGLang's own plugin
loader (``load_plugins()``, run in every engine process) calls it. In the scheduler process it enters a torch census
(``cpu_is_device``: the CPU engine's device is spelled "cpu") and wraps, by scenario (OVERLAY_CENSUS_SCENARIO):

- decode-step / prefill-chunk: ``Scheduler.run_batch`` + ``Scheduler.process_batch_result`` of a decode / extend batch
  (schedule result, forward, sample, result processing) is one step; decode-step-sampled counts decode-step's steps
  (STEP_KIND) of sampled requests, decode-step-spec those of a speculative engine (the batch's draft, verify and
  draft-extend inside run_batch, the acceptance bookkeeping inside process_batch_result);
- every call of a function of the sgl_kernel stand-in (test infrastructure) is one launch, and the torch ops and host
  reads the stand-in does inside are not counted (on a GPU that is one kernel);
- spec-verify-step: ``EAGLEWorkerV2.verify``; draft-round: ``EagleDraftWorker.draft``; draft-extend:
  ``EagleDraftWorker._draft_extend_for_decode``;
- draft-extend-draft (SPAN): what one combined draft-extend + next-draft CUDA graph would hold, as one step inside one
  capture region (``Census.capture``, non-raising, so every violation is kept with its site): a
  ``_draft_extend_for_decode`` call and the NEXT ``draft`` call of the same worker; the scheduler's work between them
  (result processing, the next batch) is not counted (the step is paused, as decode-step's). Each violation is
  attributed to the ZONE it ran in (``zone_label``: the innermost, or the path from an enclosing graph zone; ``zone_of``
  in the output, one label per violation; ``zones_entered``: per step, how often each zone was entered, so an empty
  zone is seen to have run): the model forwards SGLang's CUDA graph runners capture today (``GRAPH_ZONES``) or the
  host-side preparation around them (``outside:*``); ``split_by_zone`` sums them per zone and site.

After every step the report (torch_census ``Census.report``) and the SGLANG_OPT_* switches read during steps go to
OVERLAY_CENSUS_OUT as JSON (written atomically: the engine is shut down by killing its processes).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

FLAG_PREFIX = "SGLANG_OPT_"
# a scenario counted as another's steps (its requests differ: sglang_worker.CENSUS_SAMPLED)
STEP_KIND = {"decode-step-sampled": "decode-step", "decode-step-spec": "decode-step"}
SPAN = "draft-extend-draft"
# the zones whose violations sit inside what SGLang 0.5.23's runners capture: EAGLEDraftCudaGraphRunner's run_once
# calls EagleDraftWorker.draft_forward (eagle_draft_cuda_graph_runner.py:503-525), EAGLEDraftExtendCudaGraphRunner's
# calls the draft model's forward (eagle_draft_extend_cuda_graph_runner.py:458-481)
GRAPH_ZONES = ("graph:draft_forward", "graph:draft-model-forward")
OUTSIDE = "outside:worker"  # the span's own code outside every wrapped callee
_STATE: dict[str, Any] = {}


class _RecordingEnviron(os._Environ):  # type: ignore[type-arg]
    read: set[str] = set()  # noqa: RUF012 (shared by every instance on purpose)
    active = False

    def __getitem__(self, key: str) -> str:
        if _RecordingEnviron.active and key.startswith(FLAG_PREFIX):
            _RecordingEnviron.read.add(key)
        value: str = super().__getitem__(key)
        return value


def zone_label(stack: list[str]) -> str:
    """The zone a violation ran in, from the stack of zones entered (outermost first): the innermost, or, under a
    graph zone, the path from the outermost graph zone in (``graph:draft_forward > outside:ModelRunner.forward``: a
    runner's forward called inside what the draft graph captures)."""
    for i, zone in enumerate(stack):
        if zone in GRAPH_ZONES:
            return " > ".join(stack[i:])
    return stack[-1] if stack else OUTSIDE


def split_by_zone(violations: list[str], zones: list[str], steps: int) -> dict[str, Any]:
    """The capture violations of ``steps`` counted steps (``violations[i]`` ran in zone ``zones[i]``, a
    ``zone_label``), as per-step means by zone and by violation ("WHAT at SITE"): {"graph": {zone: {violation:
    mean}}, "outside": {...}}; a zone is on the graph side when it starts inside one of GRAPH_ZONES."""
    if len(violations) != len(zones):
        raise ValueError(f"{len(violations)} violations but {len(zones)} zone labels")
    counts: dict[str, dict[str, int]] = {}
    for violation, zone in zip(violations, zones, strict=True):
        in_zone = counts.setdefault(zone, {})
        in_zone[violation] = in_zone.get(violation, 0) + 1
    out: dict[str, dict[str, dict[str, float]]] = {"graph": {}, "outside": {}}
    for zone, in_zone in counts.items():
        out["graph" if zone.split(" > ", 1)[0] in GRAPH_ZONES else "outside"][zone] = {
            v: n / max(steps, 1) for v, n in in_zone.items()
        }
    return out


def _write() -> None:
    census = _STATE["census"]
    out = Path(os.environ["OVERLAY_CENSUS_OUT"])
    skip = int(os.environ.get("OVERLAY_CENSUS_WARMUP", "1"))
    limit = int(os.environ.get("OVERLAY_CENSUS_LIMIT", "0")) or None
    doc = {
        "report": census.report(tag=_STATE["scenario"], skip=skip, limit=limit),
        "flags_read": sorted(_RecordingEnviron.read),
        "steps_seen": len(census.steps),
    }
    if _STATE["scenario"] == SPAN:
        steps = [s for s in census.steps if s.tag == SPAN][skip:]
        steps = steps[:limit] if limit is not None else steps
        doc["zone_of"] = [z for s in steps for z in _STATE["zone_of"].get(s.index, [])]
        doc["zones_entered"] = [_STATE["entered"].get(s.index, {}) for s in steps]
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, out)


def _stepped(fn: Any, tag: str, *, when: Any = None, keep_open: bool = False, close: bool = False) -> Any:
    census = _STATE["census"]

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if when is not None and not when(self, *args, **kwargs):
            return fn(self, *args, **kwargs)
        if close:
            step = _STATE.pop("open", None)
            if step is None:
                return fn(self, *args, **kwargs)
            with census.resume(step):
                _RecordingEnviron.active = True
                try:
                    return fn(self, *args, **kwargs)
                finally:
                    _RecordingEnviron.active = False
                    _write()
        with census.step(tag) as step:
            _RecordingEnviron.active = True
            try:
                return fn(self, *args, **kwargs)
            finally:
                _RecordingEnviron.active = False
                if keep_open:
                    _STATE["open"] = step
                else:
                    _write()

    return run


def register() -> None:
    scenario = os.environ.get("OVERLAY_CENSUS_SCENARIO")
    if not scenario or "OVERLAY_CENSUS_OUT" not in os.environ or _STATE:
        return
    if (
        not _in_scheduler()
    ):  # the engine's own process and the detokenizer load plugins too; only this runs the model
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from torch_census import Census

    # multinomial's kernel is a sequence of aten ops (validity checks, then the exponential race): counted as those
    census = Census(cpu_is_device=True, expand=("multinomial",))
    _STATE.update(census=census, scenario=scenario)
    os.environ.__class__ = _RecordingEnviron
    _install(scenario)
    _one_launch_per_standin_kernel(census)
    _fp8_lm_head_on_its_gpu_branch(census)
    census.__enter__()


def _fp8_lm_head_on_its_gpu_branch(census: Any) -> None:
    """The FP8 lm_head of the series (fp8_lm_head.py) computes with torch._scaled_mm where ``_use_scaled_mm`` finds CUDA
    at SM89+ (every GPU the series targets) and otherwise with a reference branch, fp32 chunks of dequantized rows,
    that no GPU runs. On the CPU engine that gate stands in for an SM90 device (its shape conditions kept), so the
    census counts the branch a deployment runs: the same torch._scaled_mm call, on torch's CPU kernel. Labelled in
    sglang_worker.CENSUS_STANDIN; stock and a series without the module are untouched."""
    import torch

    try:
        from sglang.srt.layers.quantization import fp8_lm_head
    except ImportError:
        return

    def on_sm90(x: Any, q_w: Any) -> bool:
        return hasattr(torch, "_scaled_mm") and x.shape[-1] % 16 == 0 and q_w.shape[0] % 16 == 0

    census._patch(fp8_lm_head, "_use_scaled_mm", on_sm90)


def _one_launch_per_standin_kernel(census: Any) -> None:
    """The sgl_kernel stand-in (test infrastructure) writes each CUDA kernel as torch ops and host reads; on a GPU each
    call is one kernel launch and none of those reads happens, so each call counts as one launch and nothing inside."""
    import sgl_kernel  # the arm's
    import torch

    if "standin" not in getattr(sgl_kernel, "__version__", ""):
        return
    wrappers = census.wrap_kernels(sgl_kernel)
    for op in list(vars(torch.ops.sgl_kernel).values()):
        if getattr(op, "_fn", None) in wrappers:
            census._patch(op, "_fn", wrappers[op._fn])


def _in_scheduler() -> bool:
    import traceback

    return any(
        "scheduler" in frame.filename and frame.name == "run_scheduler_process"
        for frame in traceback.extract_stack()
    )


def _install(scenario: str) -> None:
    kind = STEP_KIND.get(scenario, scenario)
    if kind in ("decode-step", "prefill-chunk"):
        from sglang.srt.managers.scheduler import Scheduler

        def is_kind(self: Any, batch: Any, *args: Any, **kwargs: Any) -> bool:
            mode = getattr(batch, "forward_mode", None)
            if mode is None:
                return False
            return bool(mode.is_decode() if kind == "decode-step" else mode.is_extend())

        Scheduler.run_batch = _stepped(Scheduler.run_batch, scenario, when=is_kind, keep_open=True)
        Scheduler.process_batch_result = _stepped(Scheduler.process_batch_result, scenario, close=True)
        return
    from sglang.srt.speculative import eagle_worker_v2 as w

    if scenario == SPAN:
        _install_span(w)
        return
    target = {
        "spec-verify-step": (w.EAGLEWorkerV2, "verify"),
        "draft-round": (w.EagleDraftWorker, "draft"),
        "draft-extend": (w.EagleDraftWorker, "_draft_extend_for_decode"),
    }[scenario]
    cls, name = target
    setattr(cls, name, _stepped(getattr(cls, name), scenario))


def _zoned(fn: Any, label: str) -> Any:
    zones: list[str] = _STATE["zones"]

    def run(*args: Any, **kwargs: Any) -> Any:
        zones.append(label)
        step = _STATE["census"].current
        if step.tag == SPAN:
            entered = _STATE["entered"].setdefault(step.index, {})
            entered[label] = entered.get(label, 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            zones.pop()

    return run


def _install_span(w: Any) -> None:
    """draft-extend-draft: one step from a ``_draft_extend_for_decode`` call to the end of the worker's next ``draft``,
    both calls inside a capture region, each violation labelled with its zone (the module docstring)."""
    census = _STATE["census"]
    zones: list[str] = []
    _STATE.update(zones=zones, zone_of={}, zoned=set(), entered={})
    counted = census._violation

    def violation(what: str, site: str) -> None:
        step = census.current
        n = len(step.violations)
        counted(what, site)
        if len(step.violations) > n:
            _STATE["zone_of"].setdefault(step.index, []).append(zone_label(zones))

    census._violation = violation
    # the CPU path's calls that the CUDA path runs outside its graphs (docs/engines/sglang.md, "Combined draft-extend
    # + draft graph"): the eager worker's module-level helpers, bound by name in eagle_worker_v2
    for name in ("prepare_for_draft_extend", "prepare_for_draft", "build_eagle_verify_input"):
        setattr(w, name, _zoned(getattr(w, name), f"outside:{name}"))
    draft_forward = w.EagleDraftWorker.draft_forward
    w.EagleDraftWorker.draft_forward = _zoned(draft_forward, "graph:draft_forward")
    extend, draft = w.EagleDraftWorker._draft_extend_for_decode, w.EagleDraftWorker.draft

    def zone_instances(worker: Any) -> None:
        """The draft model's forward (graph) and, outside, the draft ModelRunner's forward and each draft attention
        backend's ``init_forward_metadata`` (per instance: the target shares their classes)."""
        if id(worker) in _STATE["zoned"]:
            return
        _STATE["zoned"].add(id(worker))
        runner = worker.draft_runner
        runner.model.forward = _zoned(runner.model.forward, "graph:draft-model-forward")
        runner.forward = _zoned(runner.forward, "outside:ModelRunner.forward")
        backends = {
            id(b): b
            for b in (getattr(runner, "attn_backend", None), getattr(worker, "draft_attn_backend", None))
            if b is not None
        }
        for backend in backends.values():
            backend.init_forward_metadata = _zoned(
                backend.init_forward_metadata, f"outside:{type(backend).__name__}.init_forward_metadata"
            )

    def run_extend(self: Any, *args: Any, **kwargs: Any) -> Any:
        zone_instances(self)
        unfinished = _STATE.pop("open", None)
        if unfinished is not None:  # its draft never came (the request ended): out of the report
            unfinished[1].tag = f"{SPAN}:unfinished"
        with census.step(SPAN) as step, census.capture():
            _RecordingEnviron.active = True
            zones.append("outside:_draft_extend_for_decode")
            try:
                return extend(self, *args, **kwargs)
            finally:
                zones.pop()
                _RecordingEnviron.active = False
                _STATE["open"] = (self, step)

    def run_draft(self: Any, *args: Any, **kwargs: Any) -> Any:
        opened = _STATE.get("open")
        if opened is None or opened[0] is not self:
            return draft(self, *args, **kwargs)
        del _STATE["open"]
        with census.resume(opened[1]), census.capture():
            _RecordingEnviron.active = True
            zones.append("outside:draft")
            try:
                return draft(self, *args, **kwargs)
            finally:
                zones.pop()
                _RecordingEnviron.active = False
                _write()

    w.EagleDraftWorker._draft_extend_for_decode = run_extend
    w.EagleDraftWorker.draft = run_draft
