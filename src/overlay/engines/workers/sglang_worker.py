"""Runs inside an SGLang arm (stock or patched venv, CPU engine path) for `overlay check`. Not imported by overlay.

Protocol as the other workers: one JSON request on stdin, one JSON document on stdout. Engines are started with the
CPU harness (support/testbackends/sglang/run_engine.py: test infrastructure) so the same settings are used as in
the per-patch tests. Tasks: tokenize, greedy, logits, spec (STANDALONE drafts; the label ``mtp``: NEXTN on a checkpoint
with its own NextN layer, see MTP_LABEL), speed, cold, census (the mechanism census: see task_census and
sglang_census_hook.py).
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from overlay.schemas.documents import (
        CensusRequest,
        ColdRequest,
        GreedyRequest,
        LogitsRequest,
        SpecRequest,
        SpeedRequest,
        TokenizeRequest,
    )

T_START = time.time()

# test infrastructure (engine settings, AMX forcing for spec runs), on PYTHONPATH through the manifest's
# runtime.python-path (support/testbackends/sglang in this repository)
import run_engine  # noqa: E402
from census_sites import census_record, flag_notes  # noqa: E402


def _engine(model: str, spec: dict[str, Any] | None = None, engine_args: dict[str, Any] | None = None) -> Any:
    import sglang

    run: dict[str, Any] = {"name": "check", "engine_args": engine_args or {}}
    if spec:
        run["spec"] = spec
    kwargs = run_engine._engine_kwargs({"model": model, "dtype": "float32"}, run)
    if kwargs["attention_backend"] == "intel_amx":
        run_engine._force_amx_platform()
    return sglang.Engine(**kwargs)


def _greedy_params(n: int) -> dict[str, Any]:
    return {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}


def task_tokenize(req: TokenizeRequest) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(req["model"]) / "tokenizer.json"))
    return {"ids": [tok.encode(p).ids for p in req["prompts"]], "vocab_size": tok.get_vocab_size()}


def _margins(top: list[Any]) -> list[float]:
    out = []
    for entry in top:
        vals = sorted((float(e[0]) for e in entry if e is not None and e[0] is not None), reverse=True)
        out.append(vals[0] - vals[1] if len(vals) >= 2 else float("inf"))
    return out


def task_greedy(req: GreedyRequest) -> dict[str, Any]:
    import numpy as np

    engine = _engine(req["model"])
    try:
        res = engine.generate(
            input_ids=req["prompts"],
            sampling_params=_greedy_params(req["max_tokens"]),
            return_logprob=True,
            top_logprobs_num=2,
        )
    finally:
        engine.shutdown()
    outputs, margins, files = [], [], []
    for i, r in enumerate(res):
        outputs.append([int(t) for t in r["output_ids"]])
        top = r["meta_info"].get("output_top_logprobs") or []
        margins.append(_margins(top))
        if req.get("out"):
            rows = np.array([[float(e[0]) for e in entry[:2]] for entry in top], dtype=np.float32)
            path = f"{req['out']}/greedy_{i}.npy"
            np.save(path, rows)
            files.append(path)
    return {"outputs": outputs, "margins": margins, "files": files}


def task_logits(req: LogitsRequest) -> dict[str, Any]:
    """Teacher-forced log-probabilities of every input position over the whole vocabulary (input_top_logprobs with
    top_logprobs_num = vocabulary size; the tiny models' vocabularies make that affordable)."""
    import numpy as np

    if req["vocab_size"] is None:
        raise TypeError("the logits task needs the vocab_size the tokenize task reported")
    vocab = int(req["vocab_size"])
    engine = _engine(req["model"])
    files = []
    try:
        for i, seq in enumerate(req["sequences"]):
            r = engine.generate(
                input_ids=[seq[:-1] + [seq[-1]]],
                sampling_params=_greedy_params(1),
                return_logprob=True,
                logprob_start_len=0,
                top_logprobs_num=vocab,
            )[0]
            top = r["meta_info"]["input_top_logprobs"]
            dense = np.full((len(seq) - 1, vocab), -np.inf, dtype=np.float32)
            for t, entry in enumerate(top[1 : len(seq)]):  # entry t+1 predicts seq[t+1] from seq[:t+1]
                for lp, tok, *_ in entry:
                    dense[t, int(tok)] = float(lp)
            path = f"{req['out']}/logits_{i}.npy"
            np.save(path, dense)
            files.append(path)
    finally:
        engine.shutdown()
    return {"files": files}


MTP_LABEL = "mtp"
"""The spec request's label for the MTP run: its value is a checkpoint with NextN layers (``deepseek_v3-nextn-random``),
served as its own target with ``--speculative-algorithm NEXTN`` (the draft is its NextN layer), not as a drafter of
``model``; its serial baseline is a plain engine on that checkpoint."""
MLA_ARGS = {"attention_backend": "intel_amx"}  # torch_native cannot serve MLA (docs/engines/sglang.md)
PLUGINS = Path(run_engine.__file__).resolve().parent / "plugins"
PLUGIN_NOTE = (
    "harness plugin on PYTHONPATH for this run only: support/testbackends/sglang/plugins (test infrastructure) makes "
    "stock's unconditional torch.cuda.synchronize() in DeepseekV2ForCausalLM.set_embed_and_head a no-op on CPU torch, "
    "without which the CPU engine cannot start NEXTN on DeepSeek"
)
SERIAL_NOTE = "serial baseline: a plain engine on the same checkpoint (intel_amx attention)"
_DRAFT_REPORT = "OVERLAY_SGLANG_DRAFT_REPORT"  # the plugin writes what it served there (its docstring)


def _generate(
    req: SpecRequest, model: str, spec: dict[str, Any] | None, engine_args: dict[str, Any] | None = None
) -> Any:
    engine = _engine(model, spec, engine_args)
    try:
        return engine.generate(input_ids=req["prompts"], sampling_params=_greedy_params(req["max_tokens"]))
    finally:
        engine.shutdown()


def _with_plugins(fn: Callable[[], Any]) -> tuple[Any, dict[str, Any] | None]:
    """``fn()`` with the harness plugin folder on sys.path and PYTHONPATH (the engine's spawned processes load
    SGLang plugins from it), restored afterwards; also what the plugin reported about the draft model."""
    import os
    import tempfile

    saved_path, saved_env = list(sys.path), {k: os.environ.get(k) for k in ("PYTHONPATH", _DRAFT_REPORT)}
    with tempfile.TemporaryDirectory(prefix="overlay-nextn-") as tmp:
        report = Path(tmp) / "draft.json"
        sys.path.insert(0, str(PLUGINS))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGINS), saved_env["PYTHONPATH"]) if p)
        os.environ[_DRAFT_REPORT] = str(report)
        try:
            out = fn()
        finally:
            sys.path[:] = saved_path
            for key, old in saved_env.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
        return out, (json.loads(report.read_text()) if report.is_file() else None)


def task_spec(req: SpecRequest) -> dict[str, Any]:
    k = int(req["k"])
    results: dict[str, Any] = {}
    for label, draft in req["drafts"].items():
        spec = {
            "algorithm": "STANDALONE",
            "draft_model": draft,
            "num_steps": k,
            "topk": 1,
            "num_draft_tokens": k + 1,
        }
        extra: dict[str, Any] = {}
        if label == MTP_LABEL:
            # SGLang resolves NEXTN to EAGLE, the draft being the checkpoint's own NextN layer
            spec["algorithm"] = "NEXTN"
            serial = _generate(req, draft, None, MLA_ARGS)
            res, served = _with_plugins(functools.partial(_generate, req, draft, spec))
            extra = {
                "serial": [[int(t) for t in r["output_ids"]] for r in serial],
                "about": {
                    "algorithm": "NEXTN",
                    "model": draft,
                    "draft_served": served,
                    "notes": [PLUGIN_NOTE, SERIAL_NOTE],
                },
            }
        else:
            res = _generate(req, req["model"], spec)
        runs = []
        for r in res:
            meta = r["meta_info"]
            tokens = [int(t) for t in r["output_ids"]]
            cycles = int(meta.get("spec_verify_ct") or 0)
            if meta.get("spec_accept_token_num") is not None and meta.get("spec_draft_token_num") is not None:
                accepted, drafted = int(meta["spec_accept_token_num"]), int(meta["spec_draft_token_num"])
            else:  # the first token comes from the target's prefill; each verify emits its accepted drafts + 1
                accepted, drafted = max(len(tokens) - 1 - cycles, 0), cycles * k
            runs.append(
                {
                    "tokens": tokens,
                    "from_draft": [],
                    "stats": {
                        "accepted": accepted,
                        "drafted": drafted,
                        "cycles": cycles,
                        "histogram": run_engine._jsonable(meta.get("spec_correct_drafts_histogram")),
                    },
                }
            )
        results[label] = {"results": runs, **extra}
    return {"drafts": results}


def task_speed(req: SpeedRequest) -> dict[str, Any]:
    import statistics

    engine = _engine(req["model"])
    n = int(req["decode_tokens"])
    prompt = req["prompt"]
    try:

        def once() -> tuple[float, float, float]:
            t0, c0 = time.perf_counter(), time.process_time()
            engine.generate(input_ids=[prompt], sampling_params=_greedy_params(1))
            t1 = time.perf_counter()
            engine.generate(input_ids=[prompt], sampling_params=_greedy_params(n))
            t2, c2 = time.perf_counter(), time.process_time()
            prefill = len(prompt) / (t1 - t0)
            decode = (n - 1) / max((t2 - t1) - (t1 - t0), 1e-9)  # the second request's prefill is subtracted
            return prefill, decode, (n - 1) / max(c2 - c0, 1e-9)

        once()  # warm-up
        samples = [once() for _ in range(int(req.get("inner_reps", 3)))]
    finally:
        engine.shutdown()
    return {
        "prefill_tok_s": statistics.median(s[0] for s in samples),
        "decode_tok_s": statistics.median(s[1] for s in samples),
    }


def task_cold(req: ColdRequest) -> dict[str, Any]:
    engine = _engine(req["model"])
    try:
        engine.generate(input_ids=[req["prompt"]], sampling_params=_greedy_params(1))
        t_first = time.time()
    finally:
        engine.shutdown()
    return {"t_start": T_START, "t_first_token": t_first}


CENSUS_SPAN = "draft-extend-draft"  # sglang_census_hook.SPAN: the one scenario with a capture region
# the scenarios run on a speculative engine; decode-step-spec counts decode-step's steps there (sglang_census_hook)
CENSUS_SPEC = ("decode-step-spec", "spec-verify-step", "draft-round", "draft-extend", CENSUS_SPAN)
# a scenario that counts another scenario's steps with other requests (sglang_census_hook.STEP_KIND): decode-step's
# workload with sampled requests, which take the pytorch sampling backend's filtered path
# (top_k_top_p_min_p_sampling_from_probs_torch) after the temperature and the softmax; vLLM's decode-step-sampled
# values (near Qwen3's generation defaults). Unseeded: SGLang's per-request sampling_seed acts only under
# deterministic inference, which 0.5.23 refuses with the CPU path's attention backend (docs/engines/sglang.md).
CENSUS_SAMPLED: dict[str, dict[str, float]] = {
    "decode-step-sampled": {"temperature": 0.7, "top_k": 20, "top_p": 0.8}
}
# the spec scenarios' attention backends (request field attention_backend; default intel_amx): triton declares
# needs_cpu_seq_lens False and runs its kernels in Triton's CPU interpreter (TRITON_INTERPRET=1); torch_native is
# refused for EAGLE-family algorithms (speculative/draft_utils.py:64). docs/engines/sglang.md, "Combined draft-extend"
CENSUS_BACKENDS = {
    "intel_amx": "intel_amx attention",
    "triton": "triton attention (Triton's CPU interpreter)",
}
CENSUS_WARMUP = 1  # the first step of a kind allocates buffers; it is left out of the means
CENSUS_NOT_COUNTED = {
    "collectives": "one CPU rank: no process group, no collectives run",
    "cache-hits": "no engine cache entry point is wrapped by the census",
    "capturable": "the CPU engine path captures no CUDA graph (disable_cuda_graph); no capture region "
    f"runs in this scenario, so capturability is not observed here; {CENSUS_SPAN} measures it for one combined "
    "draft-extend + next-draft graph (a capture region over both calls)",
}
# the stand-ins' files (sgl_kernel, sitecustomize, plugins), as call sites name them
STANDIN_SITE = "testbackends/sglang/"
CENSUS_STANDIN = (
    "sgl_kernel CPU ops (pure-torch stand-in, support/testbackends/sglang/site/sgl_kernel) and the "
    "torchvision stub; attention intel_amx served by the stand-in on spec runs; the FP8 lm_head's SM89+ gate "
    "(fp8_lm_head._use_scaled_mm) answers as on an SM90 GPU, so its torch._scaled_mm branch runs on torch's CPU kernel"
)


def task_census(req: CensusRequest) -> dict[str, Any]:
    """One scenario of the CPU engine under the torch census (counted in the scheduler process, see
    sglang_census_hook.py); the patch's SGLANG_OPT_* switch comes in this process's environment."""
    import os
    import tempfile

    scenario = req["scenario"]
    if req.get("options"):
        raise SystemExit(
            f"sglang census: CLI options {sorted(req['options'])} are not applied by the CPU census"
        )
    if scenario not in ("decode-step", "prefill-chunk", *CENSUS_SPEC, *CENSUS_SAMPLED):
        raise SystemExit(f"sglang census: unknown scenario {scenario!r}")
    steps = int(req.get("steps", 4))
    algorithm = req.get("algorithm", "STANDALONE")
    if algorithm not in ("STANDALONE", "NEXTN"):
        raise SystemExit(f"sglang census: algorithm {algorithm!r}: expected STANDALONE or NEXTN")
    nextn = algorithm == "NEXTN"
    if nextn and (scenario not in CENSUS_SPEC or req.get("draft")):
        raise SystemExit(
            "sglang census: NEXTN runs a spec scenario on a checkpoint with its own NextN layer (no draft); "
            f"got scenario {scenario!r}, draft {req.get('draft')!r}"
        )
    k = int(req.get("num_draft", 1))  # draft steps per cycle (topk 1: a chain of k tokens)
    if k < 1 or (scenario not in CENSUS_SPEC and "num_draft" in req):
        raise SystemExit(f"sglang census: num_draft {k} needs a spec scenario and k >= 1 (got {scenario!r})")
    backend = req.get("attention_backend")
    if backend is not None and (scenario not in CENSUS_SPEC or backend not in CENSUS_BACKENDS):
        raise SystemExit(
            f"sglang census: attention_backend {backend!r} needs a spec scenario and one of "
            f"{sorted(CENSUS_BACKENDS)} (got scenario {scenario!r})"
        )
    engine_args = {**(MLA_ARGS if nextn else {}), **({"attention_backend": backend} if backend else {})}
    spec = None
    if scenario in CENSUS_SPEC:
        spec = {
            "algorithm": algorithm,
            "draft_model": req.get("draft") or req["model"],
            "num_steps": k,
            "topk": 1,
            "num_draft_tokens": k + 1,
        }
    with tempfile.TemporaryDirectory(prefix="overlay-census-") as tmp:
        dist = Path(tmp) / "overlay_census-0.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: overlay-census\nVersion: 0.0\n")
        (dist / "entry_points.txt").write_text(
            "[sglang.srt.plugins]\noverlay_census = sglang_census_hook:register\n"
        )
        workers = str(Path(__file__).resolve().parent)
        for entry in (workers, tmp):
            sys.path.insert(0, entry)  # forked children inherit sys.path, spawned ones PYTHONPATH
        os.environ["PYTHONPATH"] = os.pathsep.join([tmp, workers, os.environ.get("PYTHONPATH", "")])
        out = Path(tmp) / "census.json"
        os.environ.update(
            OVERLAY_CENSUS_SCENARIO=scenario,
            OVERLAY_CENSUS_OUT=str(out),
            OVERLAY_CENSUS_WARMUP=str(CENSUS_WARMUP),
            OVERLAY_CENSUS_LIMIT=str(steps),
        )
        if backend == "triton":  # the scheduler imports Triton after this: its kernels run interpreted on CPU
            os.environ["TRITON_INTERPRET"] = "1"

        def generate() -> None:
            engine = _engine(req["model"], spec, engine_args)
            try:
                prompt = [1 + (i * 37) % 500 for i in range(24 if scenario != "prefill-chunk" else 200)]
                new = 1 if scenario == "prefill-chunk" else (k + 1) * (steps + CENSUS_WARMUP) + 2
                new += k + 1 if scenario == CENSUS_SPAN else 0  # a span needs the next cycle's draft
                params = {**_greedy_params(new), **CENSUS_SAMPLED.get(scenario, {})}
                engine.generate(input_ids=[prompt], sampling_params=params)
            finally:
                engine.shutdown()

        if nextn:
            _with_plugins(generate)
        else:
            generate()
        if not out.is_file():
            raise SystemExit(f"sglang census: the scheduler wrote no census ({out}); the plugin did not load")
        doc = json.loads(out.read_text())
    report = doc["report"]
    metrics = dict(report["metrics"])
    notes = [
        f"NEXTN k={k}, topk 1 (the checkpoint's own NextN layer; {CENSUS_BACKENDS[backend or 'intel_amx']}); "
        f"{PLUGIN_NOTE}"
        if nextn
        else f"STANDALONE k={k}, topk 1 (draft = {'the target' if not req.get('draft') else req['draft']})"
        if spec
        else f"plain decode, batch 1, sampled {CENSUS_SAMPLED[scenario]} (pytorch sampling backend)"
        if scenario in CENSUS_SAMPLED
        else "plain decode, batch 1",
        f"{report['steps']} steps after {CENSUS_WARMUP} warm-up",
    ]
    if backend and not nextn:
        notes[0] += f"; {CENSUS_BACKENDS[backend]}"
    for metric, why in CENSUS_NOT_COUNTED.items():
        if metric == "capturable" and scenario == CENSUS_SPAN:
            continue
        metrics[metric] = None
        notes.append(f"{metric}: not counted ({why})")
    detail: dict[str, Any] = {"flags_read": doc["flags_read"]}
    if scenario == CENSUS_SPAN:
        from sglang_census_hook import split_by_zone

        detail["violations"] = split_by_zone(report["violations"], doc["zone_of"], report["steps"])
        detail["zones_entered"] = doc["zones_entered"]
        # what the stand-ins stand for inside the span: each sgl_kernel stand-in call is one launch and nothing
        # inside it is counted; a violation whose site lies in a stand-in's own file would be the stand-in's
        detail["standin_kernels"] = {k: v for k, v in report["kinds"].items() if ":kernel:" in k}
        detail["standin_violations"] = [v for v in report["violations"] if STANDIN_SITE in v]
        notes.append(
            f"{CENSUS_SPAN}: one step = _draft_extend_for_decode + the next draft (the scheduler's work between them "
            "not counted), inside one capture region; detail.violations splits its violations (per-step means) into "
            "the graph runners' captured model forwards and the host-side preparation outside them"
        )
    flagged, unread = flag_notes(
        "SGLANG_OPT_",
        doc["flags_read"],
        "during the steps (the patch's code is not on the CPU engine path of this scenario)",
    )
    notes += flagged
    if unread:
        metrics = dict.fromkeys(metrics)
    return census_record(scenario, report, metrics, notes, steps=steps, standin=CENSUS_STANDIN, detail=detail)


TASKS = {name[5:]: fn for name, fn in globals().items() if name.startswith("task_")}


def main() -> None:
    req = json.loads(sys.stdin.read())
    result = TASKS[req["task"]](req)
    import sglang

    result["engine_version"] = getattr(sglang, "__version__", "?")
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
