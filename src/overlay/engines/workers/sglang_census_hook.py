"""The torch census inside SGLang's scheduler process (test infrastructure for `overlay check --mechanism`).

sglang_worker.py's ``census`` task starts the CPU engine with a throwaway folder on PYTHONPATH holding an
``overlay_census`` distribution whose ``sglang.srt.plugins`` entry point is ``register`` below; SGLang's own plugin
loader (``load_plugins()``, run in every engine process) calls it. In the scheduler process it enters a torch census
(``cpu_is_device``: the CPU engine's device is spelled "cpu") and wraps, by scenario (OVERLAY_CENSUS_SCENARIO):

- decode-step / prefill-chunk: ``Scheduler.run_batch`` + ``Scheduler.process_batch_result`` of a decode / extend batch
  (schedule result, forward, sample, result processing) is one step; decode-step-sampled counts decode-step's steps
  (STEP_KIND) of sampled requests;
- every call of a function of the sgl_kernel stand-in (test infrastructure) is one launch, and the torch ops and host
  reads the stand-in does inside are not counted (on a GPU that is one kernel);
- spec-verify-step: ``EAGLEWorkerV2.verify``; draft-round: ``EagleDraftWorker.draft``; draft-extend:
  ``EagleDraftWorker._draft_extend_for_decode``.

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
STEP_KIND = {"decode-step-sampled": "decode-step"}
_STATE: dict[str, Any] = {}


class _RecordingEnviron(os._Environ):  # type: ignore[type-arg]
    read: set[str] = set()  # noqa: RUF012 (shared by every instance on purpose)
    active = False

    def __getitem__(self, key: str) -> str:
        if _RecordingEnviron.active and key.startswith(FLAG_PREFIX):
            _RecordingEnviron.read.add(key)
        value: str = super().__getitem__(key)
        return value


def _write() -> None:
    census = _STATE["census"]
    out = Path(os.environ["OVERLAY_CENSUS_OUT"])
    doc = {
        "report": census.report(
            tag=_STATE["scenario"],
            skip=int(os.environ.get("OVERLAY_CENSUS_WARMUP", "1")),
            limit=int(os.environ.get("OVERLAY_CENSUS_LIMIT", "0")) or None,
        ),
        "flags_read": sorted(_RecordingEnviron.read),
        "steps_seen": len(census.steps),
    }
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

    target = {
        "spec-verify-step": (w.EAGLEWorkerV2, "verify"),
        "draft-round": (w.EagleDraftWorker, "draft"),
        "draft-extend": (w.EagleDraftWorker, "_draft_extend_for_decode"),
    }[scenario]
    cls, name = target
    setattr(cls, name, _stepped(getattr(cls, name), scenario))
