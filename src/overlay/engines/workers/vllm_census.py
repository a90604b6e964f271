"""The mechanism census in vLLM's real call path (the CPU build, runs inside a vLLM arm; never imports overlay).

vllm_worker.py's ``census`` task calls ``task_census(req)`` here. Request (overlay.schemas CensusRequest): ``model``,
``scenario``, ``steps`` (counted steps, after the warm-up), ``options`` (refused: the CPU census applies none).

Result shape (every scenario, "cold-start" included, returns this; vllm_worker.py adds ``engine_version``):

    {"scenario": str,                      # the scenario run
     "steps": int,                         # steps counted (after the warm-up)
     "metrics": {METRIC: float | bool | None},   # per-step means; None = not counted here (the reason in notes)
     "sites": {METRIC: [["vllm/path.py:LINE", count], ...]},   # summed over the counted steps, most first
     "detail": {"kinds": {...}, "per_step": [{METRIC: n, ...}, ...], "uncounted": {METRIC: value}, ...},
     "notes": [str, ...],                  # what ran, what is not counted and why
     "standin": str | None}                # test infrastructure in the path (None: the real engine only)

METRIC is every name of torch_census METRICS (host-syncs, h2d-copies, pageable-copies, eager-launches,
graph-launches, collectives, bytes-moved, peak-memory, capturable, cache-hits, sort-elements, alloc-bytes,
random-elements).
"cold-start" is dispatched to vllm_cold.py ``census(req)`` (another module), which returns the same shape.
"decode-step-sampled", "decode-step-top-p" and "decode-step-penalties" count decode steps (STEP_KIND) of seeded
sampled requests (SAMPLED: top-k with top-p, top-p alone, temperature with the three penalties), which take the
sampler's top-k / top-p or penalties path; "spec-verify-step-sampled" counts spec-verify-step's steps with
decode-step-sampled's requests (the rejection sampler's random path).

How (docs/engines/vllm.md, "Mechanism census"): the engine is vllm_worker's ``_llm`` (in this process, uni executor,
float32, eager) with the scenario's settings; one census step is one ``LLMEngine.step()`` (schedule, execute_model,
sample_tokens with the n-gram proposer, update_from_output, post_step, output processing), sorted into scenarios by
the SchedulerOutput it scheduled (``_kind``), the first of a kind a warm-up. Placement ``cuda-layout`` (the default;
``OVERLAY_VLLM_CENSUS_PLACEMENT=cpu-runner`` counts the CPU runner as it is, SGLang's ``cpu_is_device``): the CPU
runner's aliased buffers get their own device half back, the host halves are pinned host memory and the runner's
device is spelled ``cpu:0`` (``_cuda_layout``); the waits the CPU runner made no-ops count as host syncs
(``_count_waits``). A ``VLLM_OVL_*`` switch set but never read by name makes every metric None.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import vllm_settings
from census_sites import census_record, flag_notes

if TYPE_CHECKING:
    from overlay.schemas.documents import CensusRequest

# a vLLM patch's environment switch (Overlay-Flag: VLLM_OVL_NAME=1): set but never read by the engine = not measured
FLAG_PREFIX = "VLLM_OVL_"
SCENARIOS = (
    "decode-step",
    "decode-step-sampled",
    "decode-step-top-p",
    "decode-step-penalties",
    "prefill-chunk",
    "spec-verify-step",
    "spec-verify-step-sampled",
    "cold-start",
)
# a scenario that counts the steps of another kind with other requests: decode-step's workload with seeded sampled
# requests (SAMPLED), which take the sampler's top-k / top-p or penalties path
STEP_KIND = {
    "decode-step-sampled": "decode-step",
    "decode-step-top-p": "decode-step",
    "decode-step-penalties": "decode-step",
    "spec-verify-step-sampled": "spec-verify-step",
}
SAMPLED: dict[str, dict[str, float]] = {
    "decode-step-sampled": {
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
    },  # near Qwen3's generation defaults
    "decode-step-top-p": {"temperature": 0.7, "top_p": 0.9},  # top-p alone, as Llama 3's defaults sample
    # the sampler's penalties path (a generation_config's repetition_penalty is a request default in vLLM)
    "decode-step-penalties": {
        "temperature": 0.7,
        "repetition_penalty": 1.05,
        "presence_penalty": 0.3,
        "frequency_penalty": 0.2,
    },
}
# spec-verify-step's n-gram speculation with decode-step-sampled's requests: the rejection sampler's random path
SAMPLED["spec-verify-step-sampled"] = SAMPLED["decode-step-sampled"]
WARMUP = 1  # the first step of a kind (buffers, first-use caches) is left out of the means
BATCH = 4  # requests decoded together in decode-step and spec-verify-step
CHUNK = 64  # max_num_batched_tokens of prefill-chunk: the prompt is prefilled in chunks of this many tokens
SPEC_K = 3  # n-gram draft tokens per verify step
DEVICE_HOLDERS = ("sampler", "rejection_sampler", "drafter")  # runner attributes whose `device` is respelled
# the tiny models' "repetitive" prompts (overlay.check.models.corpus), each phrase repeated: one per request
SPEC_PROMPTS = (
    "the cat sat. " * 6 + "the cat",
    "1 2 3 4 5 6 7 8 " * 3 + "1 2 3",
    "a b c d e f g " * 4 + "a b",
    "count: one two three four five " * 3 + "count: one",
)
PLACEMENTS = ("cuda-layout", "cpu-runner")
NGRAM, MTP = (
    "ngram",
    "mtp",
)  # the spec scenarios' proposers (the request's ``draft``; vllm_worker's draft values)
DRAFTS = (NGRAM, MTP)
NOT_COUNTED = {
    "collectives": "one CPU rank (uni executor): no process group, no collectives run",
    "cache-hits": "no engine cache entry point is wrapped by the census",
    "capturable": "enforce_eager, and the CPU model runner captures no CUDA graph (use_cuda_graph False): no "
    "capture region runs, so capturability is not observed",
    "graph-launches": "no CUDA graph is captured or replayed on the CPU path (enforce_eager)",
}


def task_census(req: CensusRequest) -> dict[str, Any]:
    """One scenario of the real V1 engine (in this process) under the torch census: see the module docstring."""
    scenario = req["scenario"]
    if scenario == "cold-start":
        import importlib

        try:
            cold = importlib.import_module("vllm_cold")  # workers/vllm_cold.py, next to this module
        except ModuleNotFoundError as exc:
            if exc.name != "vllm_cold":
                raise
            raise SystemExit(
                "vllm census: the cold-start scenario is not available (workers/vllm_cold.py is absent)"
            ) from None
        result: dict[str, Any] = cold.census(req)
        return result
    if scenario not in SCENARIOS:
        raise SystemExit(f"vllm census: unknown scenario {scenario!r} (scenarios: {', '.join(SCENARIOS)})")
    if req.get("options"):
        raise SystemExit(
            f"vllm census: CLI options {sorted(req['options'])} are not applied by the CPU census"
        )
    placement = os.environ.get("OVERLAY_VLLM_CENSUS_PLACEMENT", PLACEMENTS[0])
    if placement not in PLACEMENTS:
        raise SystemExit(f"vllm census: OVERLAY_VLLM_CENSUS_PLACEMENT={placement!r}: expected {PLACEMENTS}")
    steps = int(req.get("steps", 4))
    os.environ.__class__ = _RecordingEnviron  # which VLLM_OVL_* switches vLLM reads from here on
    try:
        draft = req.get("draft") or NGRAM
        if draft not in DRAFTS:
            raise SystemExit(f"vllm census: draft {draft!r} is not one of {', '.join(DRAFTS)}")
        llm = _engine(req["model"], scenario, draft)
        try:
            run = _run(llm, req["model"], scenario, steps, placement, draft)
        finally:
            import vllm_worker

            vllm_worker._shutdown(llm)
    finally:
        os.environ.__class__ = os._Environ
    return _result(scenario, steps, placement, run)


class _RecordingEnviron(os._Environ):  # type: ignore[type-arg]
    """os.environ, remembering the FLAG_PREFIX variables the engine reads by name (``get``, ``in``, ``getenv`` and
    ``[]`` all go through ``__getitem__``): the first caller outside os and _collections_abc names the key, as a
    constant of its code (``os.getenv("VLLM_OVL_X")``, vLLM's envs lambdas) or in a closure variable (a lambda made by a
    helper such as ``env_with_choices(name, ...)``). Copies of the whole environment (``dict(os.environ)``,
    ``os.environ.items()``: tqdm, networkx and platform do it at import) read every key and do not count."""

    read: set[str] = set()  # noqa: RUF012 (shared by every instance on purpose)

    def __getitem__(self, key: str) -> str:
        if key.startswith(FLAG_PREFIX) and _named_by_caller(key):
            _RecordingEnviron.read.add(key)
        value: str = super().__getitem__(key)
        return value


def _named_by_caller(key: str) -> bool:
    import _collections_abc

    plumbing = {os.__file__, _collections_abc.__file__, __file__}
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen") or frame.f_code.co_filename in plumbing
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return False
    code = frame.f_code
    return key in code.co_consts or any(frame.f_locals.get(v) == key for v in code.co_freevars)


def _engine(model: str, scenario: str, draft: str = NGRAM) -> Any:
    """vllm_worker's engine (in this process, uni executor, float32 or the model's own settings, eager) with the
    scenario's settings; the spec scenarios speculate with ``draft`` (n-gram, or the model's MTP head)."""
    import vllm_worker

    extra: dict[str, Any] = {"max_num_seqs": 2 * BATCH}
    if scenario == "prefill-chunk":
        extra |= {"max_num_batched_tokens": CHUNK, "enable_chunked_prefill": True}
    if STEP_KIND.get(scenario, scenario) == "spec-verify-step":
        # the spec task's proposer, without its counters (the census counts a step as is), and the model's own
        # speculative settings (the hybrid: prefix caching off)
        extra["speculative_config"] = vllm_worker.speculative_config(draft, SPEC_K)
        extra |= vllm_settings.model_settings(model)["speculative_args"]
    return vllm_worker._llm(model, engine_args=extra)


def _workload(scenario: str, steps: int, model: str) -> tuple[list[list[int]], int]:
    """The prompts (token ids) and max_tokens of a scenario: enough steps of its kind after the warm-up."""
    if scenario == "prefill-chunk":
        # (WARMUP + steps) full chunks, then a shorter last one (which also samples the first token)
        return [[1 + (i * 37) % 500 for i in range((WARMUP + steps) * CHUNK + CHUNK // 2)]], 2
    if STEP_KIND.get(scenario, scenario) == "spec-verify-step":
        # repeated phrases: the n-gram proposer finds the last tokens earlier in the context and drafts from there
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
        return [tok.encode(text).ids for text in SPEC_PROMPTS], 8 * (WARMUP + steps) + 16
    return [[0, *(1 + (i * 37 + r * 101) % 500 for i in range(24))] for r in range(BATCH)], WARMUP + steps + 2


def _kind(out: Any, prefilling: dict[str, bool]) -> str | None:
    """The scenario one engine step belongs to, from its SchedulerOutput (``prefilling``: which requests had prompt
    tokens left before the step)."""
    n: dict[str, int] = out.num_scheduled_tokens
    if not n:
        return None
    spec: dict[str, list[int]] = out.scheduled_spec_decode_tokens or {}
    pre = [r for r in n if prefilling.get(r, True)]
    if pre:
        full = len(n) == 1 and all(n[r] == CHUNK for r in pre)
        return "prefill-chunk" if full else "prefill"
    if any(spec.get(r) for r in n):
        return "spec-verify-step" if len(n) == BATCH else "spec-partial"
    return "decode-step" if len(n) == BATCH else "decode-partial"


def _runner(llm: Any) -> Any:
    # LLMEngine -> InprocClient (VLLM_ENABLE_V1_MULTIPROCESSING=0) -> EngineCore
    core = llm.llm_engine.engine_core.engine_core
    return core, core.model_executor.driver_worker.worker.model_runner


def _cuda_layout(census: Any, runner: Any) -> tuple[list[str], list[str]]:
    """Give the CPU model runner back the two-sided buffers gpu_model_runner has on CUDA (CPUModelRunner's
    _postprocess_tensors makes each device half the CPU half): every ``CpuGpuBuffer`` of the runner and its block
    tables, and every ``X`` / ``X_cpu_tensor`` pair of the input batch, gets a device half of its own (a copy, made
    before the census: device memory); the host halves and the runner's other ``*_cpu*`` / ``*pinned*`` tensors are
    pinned host memory, as PIN_MEMORY makes them on CUDA; the runner's, the input batch's, the block tables' and the
    samplers' and drafter's ``device`` is spelled ``cpu:0``. Returns (the buffers split, the devices respelled)."""
    import torch
    from vllm.v1.utils import CpuGpuBuffer

    done: list[str] = []
    respelled: list[str] = []

    def split(buf: Any, name: str) -> None:
        if buf.gpu is buf.cpu:
            buf.gpu = buf.cpu.clone()
            done.append(name)
        census.mark_host(buf.cpu, pinned=True)
        census.mark_device(buf.gpu)

    for name, v in list(vars(runner).items()):
        if isinstance(v, CpuGpuBuffer):
            split(v, f"runner.{name}")
        elif isinstance(v, torch.Tensor) and ("_cpu" in name or "pinned" in name):
            census.mark_host(v, pinned=True)
    batch = runner.input_batch
    for name, v in list(vars(batch).items()):
        if isinstance(v, CpuGpuBuffer):
            split(v, f"input_batch.{name}")
        elif name.endswith("_cpu_tensor") and isinstance(v, torch.Tensor):
            dev = getattr(batch, name[: -len("_cpu_tensor")], None)
            if dev is not None and dev is v:
                setattr(batch, name[: -len("_cpu_tensor")], dev.clone())
                done.append(f"input_batch.{name[: -len('_cpu_tensor')]}")
            census.mark_host(v, pinned=True)
        elif isinstance(v, torch.Tensor) and ("_cpu" in name or "pinned" in name):
            census.mark_host(v, pinned=True)
    tables = list(batch.block_table.block_tables)
    for i, table in enumerate(tables):
        for name, v in list(vars(table).items()):
            if isinstance(v, CpuGpuBuffer):
                split(v, f"block_table[{i}].{name}")
    # the device spelled with an index, as "cuda:0" is: `.to(self.device)` of a host tensor is an upload and of a
    # device tensor a no-op, `torch.tensor(..., device=self.device)` an upload; "cpu" stays the host
    cpu, spelled = torch.device("cpu"), torch.device("cpu", 0)
    for obj in (
        runner,
        batch,
        batch.block_table,
        *tables,
        *(getattr(runner, n, None) for n in DEVICE_HOLDERS),
    ):
        if obj is not None and getattr(obj, "device", None) == cpu:
            obj.device = spelled
            respelled.append(type(obj).__name__)
    return done, respelled


def _count_waits(census: Any, runner: Any) -> int:
    """The host-blocking waits the CPU runner turns into no-ops, counted as host syncs where they are called:
    ``torch.accelerator.synchronize`` (CPUModelRunner makes it a no-op) and ``synchronize`` of the event
    placeholders the runner was built with (``_torch_cuda_wrapper``: ``torch.Event`` objects on CUDA). Returns how
    many events were wrapped."""
    import torch

    census.wrap(torch.accelerator, "synchronize", "host-syncs", kind="torch.accelerator.synchronize")
    events = 0
    for v in vars(runner).values():
        if type(v).__name__ == "_EventPlaceholder":
            census.wrap(v, "synchronize", "host-syncs", kind="Event.synchronize")
            events += 1
    return events


def _run(
    llm: Any, model: str, scenario: str, steps: int, placement: str, draft: str = NGRAM
) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # torch_census sits next to this module
    from torch_census import Census
    from vllm import SamplingParams

    engine = llm.llm_engine
    core, runner = _runner(llm)
    prompts, max_tokens = _workload(scenario, steps, model)
    for i, p in enumerate(prompts):
        if (
            scenario in STEP_KIND
        ):  # seeded: the same tokens in every arm whose sampler keeps the same distribution
            params = SamplingParams(
                **SAMPLED[scenario], seed=1000 + i, max_tokens=max_tokens, ignore_eos=True
            )
        else:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(f"census-{i}", {"prompt_token_ids": p}, params)
    import vllm.v1.utils

    # a CpuGpuBuffer copy is counted at the line that asks for it, not inside vllm/v1/utils.py
    census = Census(cpu_is_device=placement == "cpu-runner", skip=(vllm.v1.utils.__file__,))
    split, respelled = _cuda_layout(census, runner) if placement == "cuda-layout" else ([], [])
    events = _count_waits(census, runner)
    sched = core.scheduler
    schedule = sched.schedule
    seen: dict[str, Any] = {}

    def classified(*args: Any, **kwargs: Any) -> Any:
        prefilling = {rid: r.num_computed_tokens < r.num_prompt_tokens for rid, r in sched.requests.items()}
        out = schedule(*args, **kwargs)
        seen["kind"] = _kind(out, prefilling)
        seen["drafts"] = sum(len(v) for v in (out.scheduled_spec_decode_tokens or {}).values())
        return out

    sched.schedule = classified
    tokens: dict[str, list[int]] = {}
    kinds: list[str | None] = []
    drafts: list[int] = []
    counted = 0
    try:
        with census:
            for _ in range(max_tokens + len(prompts) * 64):
                if counted >= WARMUP + steps or not engine.has_unfinished_requests():
                    break
                with census.step() as step:
                    outputs = engine.step()
                kind = seen.pop("kind", None)
                step.tag = scenario if kind is not None and kind == STEP_KIND.get(scenario) else kind
                kinds.append(step.tag)
                if step.tag == scenario:
                    counted += 1
                    drafts.append(int(seen.get("drafts", 0)))
                for o in outputs:
                    tokens[o.request_id] = [int(t) for t in o.outputs[0].token_ids]
    finally:
        del sched.schedule
    return {
        "report": census.report(tag=scenario, skip=WARMUP, limit=steps),
        "kinds": kinds,
        "drafts": drafts[WARMUP:],
        "tokens": [tokens.get(f"census-{i}", []) for i in range(len(prompts))],
        "split": split,
        "respelled": respelled,
        "events": events,
        "runner": f"{type(runner).__module__}.{type(runner).__qualname__}",
        "draft": draft,
    }


def _result(scenario: str, steps: int, placement: str, run: dict[str, Any]) -> dict[str, Any]:
    report = run["report"]
    metrics = dict(report["metrics"])
    described = {
        "decode-step": f"plain decode, batch {BATCH}",
        **{s: f"plain decode, batch {BATCH}, seeded sampled requests {SAMPLED[s]}" for s in SAMPLED},
        "prefill-chunk": f"one request, chunked prefill of {CHUNK} tokens per step",
        "spec-verify-step": (
            f"MTP speculative (the model's own MTP head, k={SPEC_K})"
            if run["draft"] == MTP
            else f"n-gram speculative (k={SPEC_K}, lookup 2-5)"
        )
        + f", batch {BATCH}, draft tokens per counted step: {run['drafts']}",
    }
    described["spec-verify-step-sampled"] = (
        described["spec-verify-step"] + f", seeded sampled requests {SAMPLED['spec-verify-step-sampled']}"
    )
    what = described[scenario]
    notes = [
        what,
        (
            f"{report['steps']} steps after {WARMUP} warm-up; one step = LLMEngine.step() (schedule, "
            "execute_model, sample_tokens, update_from_output, post_step, output processing)"
        ),
        f"placement {placement}"
        + (
            f": {len(run['split'])} CPU-runner buffers given their own device half, the device of "
            f"{', '.join(run['respelled'])} spelled cpu:0"
            if placement == "cuda-layout"
            else ": the CPU runner's buffers as it has them (device half = host half), cpu_is_device"
        ),
        f"host-blocking waits counted: torch.accelerator.synchronize and {run['events']} runner event placeholders",
    ]
    for metric, why in NOT_COUNTED.items():
        metrics[metric] = None
        notes.append(f"{metric}: not counted ({why})")
    flagged, unread = flag_notes(
        FLAG_PREFIX,
        _RecordingEnviron.read,
        "from the engine's start to the last step (the patch's code is not on this path)",
    )
    notes += flagged
    if unread:
        metrics = dict.fromkeys(metrics)
    return census_record(
        scenario,
        report,
        metrics,
        notes,
        steps=steps,
        standin=vllm_settings.standin_label(),
        detail={
            "step_kinds": run["kinds"],
            "drafts": run["drafts"],
            "tokens": run["tokens"],
            "runner": run["runner"],
            "placement": placement,
            "split": run["split"],
            "flags_read": sorted(_RecordingEnviron.read),
            "draft": run["draft"],
        },
    )
