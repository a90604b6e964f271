"""Runs inside an mlx-lm arm (stock or patched venv) for `overlay check`. Not imported by overlay itself.

Protocol: one JSON request on stdin, one JSON document on stdout. Uses only mlx-lm's public API, so the same script
measures the stock and the patched engine. Tasks: tokenize, greedy, logits, speed, spec, cold, census (the mechanism
census: mlx_lm_census.py, its hooks mlx_census_hooks.py). The request's ``options`` (the CLI options the check's
flags set) reach every generating task as keyword arguments (mlx_lm_options.py); each result says which it applied.

The sibling modules are imported from this script's folder (sys.path[0] when the arm runs the script by its path,
which is how overlay.engines.mlx_lm runs it, from the source tree or the installed package alike).
"""

from __future__ import annotations

import json
import sys
import time
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

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mlx_lm_options as options  # noqa: E402

SAMPLER_FIXED = ("max_tokens", "sampler")  # generate_step arguments every task sets itself


def _load(path: str) -> Any:
    from mlx_lm import load

    return load(path)


def _argmax_sampler(mx: Any) -> Any:
    return lambda logprobs: mx.argmax(logprobs, axis=-1)


def _step_options(req: GreedyRequest | SpeedRequest | ColdRequest) -> tuple[dict[str, Any], dict[str, Any]]:
    """generate_step's keyword arguments from the request's options, and the options report."""
    from mlx_lm.generate import generate_step

    kwargs, unused = options.split(req.get("options"), generate_step, fixed=SAMPLER_FIXED)
    return kwargs, options.report(kwargs, unused, req.get("options"))


def task_tokenize(req: TokenizeRequest) -> dict[str, Any]:
    _model, tok = _load(req["model"])
    return {"ids": [tok.encode(p) for p in req["prompts"]], "vocab_size": len(tok.get_vocab())}


def task_greedy(req: GreedyRequest) -> dict[str, Any]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model, _tok = _load(req["model"])
    kwargs, used = _step_options(req)
    outputs, margins, files = [], [], []
    for i, ids in enumerate(req["prompts"]):
        toks, marg, rows = [], [], []
        for tok, logprobs in generate_step(
            mx.array(ids), model, max_tokens=req["max_tokens"], sampler=_argmax_sampler(mx), **kwargs
        ):
            lp = np.array(logprobs.astype(mx.float32))
            top2 = np.partition(lp, -2)[-2:]
            toks.append(int(tok))
            marg.append(float(top2.max() - top2.min()))
            rows.append(lp)
        outputs.append(toks)
        margins.append(marg)
        if req.get("out"):
            path = f"{req['out']}/greedy_{i}.npy"
            np.save(path, np.stack(rows).astype(np.float32))
            files.append(path)
    return {"outputs": outputs, "margins": margins, "files": files, "options": used}


def task_logits(req: LogitsRequest) -> dict[str, Any]:
    import mlx.core as mx

    model, _tok = _load(req["model"])
    files = []
    for i, ids in enumerate(req["sequences"]):
        logits = model(mx.array(ids[:-1])[None])[0].astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        path = f"{req['out']}/logits_{i}.npy"
        np.save(path, np.array(logprobs))
        files.append(path)
    why = "the logits task runs the model's forward on whole sequences (no generation function)"
    return {
        "files": files,
        "options": {"applied": {}, "unused": dict.fromkeys(req.get("options") or {}, why)},
    }


def task_speed(req: SpeedRequest) -> dict[str, Any]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model, _tok = _load(req["model"])
    kwargs, used = _step_options(req)
    prompt = mx.array(req["prompt"])
    n = req["decode_tokens"]

    def run() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        t_first = None
        c_first = 0.0
        count = 0
        for _tok, _lp in generate_step(prompt, model, max_tokens=n, sampler=_argmax_sampler(mx), **kwargs):
            count += 1
            if t_first is None:
                t_first = time.perf_counter()
                c_first = time.process_time()
        t_end = time.perf_counter()
        c_end = time.process_time()
        assert t_first is not None
        return (
            len(req["prompt"]) / (t_first - t0),
            (count - 1) / max(t_end - t_first, 1e-9),
            (count - 1) / max(c_end - c_first, 1e-9),
        )

    run()  # warm-up: compilation, caches
    samples = [run() for _ in range(req.get("inner_reps", 3))]
    med = [float(np.median([s[i] for s in samples])) for i in range(3)]
    return {"prefill_tok_s": med[0], "decode_tok_s": med[1], "decode_cpu_tok_s": med[2], "options": used}


def task_spec(req: SpecRequest) -> dict[str, Any]:
    """Speculative greedy decoding, once per draft in ``drafts`` (label -> draft model folder, or "mtp": the model
    drafts with its own MTP head, patched mlx-lm only, loaded with keep_mtp). ``adaptive_draft``: the patched
    adaptive controller. The options go to speculative_generate_step (through stream_generate); the draft model,
    draft kind, draft length and token budget are the task's own."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import speculative_generate_step, stream_generate

    uses_mtp = "mtp" in req["drafts"].values()
    model, tok = load(req["model"], model_config={"keep_mtp": True}) if uses_mtp else _load(req["model"])
    kwargs, unused = options.split(
        req.get("options"),
        speculative_generate_step,
        fixed=(*SAMPLER_FIXED, "draft_model", "draft_kind", "num_draft_tokens"),
    )
    if req.get("adaptive_draft"):
        kwargs["adaptive_draft"] = True
    drafts: dict[str, Any] = {}
    for label, path in req["drafts"].items():
        if path == "mtp":
            draft, kind = None, {"draft_kind": "mtp"}
        else:
            draft, kind = _load(path)[0], {}
        results = []
        for ids in req["prompts"]:
            tokens, flags = [], []
            stats = None
            for resp in stream_generate(
                model,
                tok,
                mx.array(ids),
                max_tokens=req["max_tokens"],
                draft_model=draft,
                num_draft_tokens=req["k"],
                sampler=_argmax_sampler(mx),
                **kwargs,
                **kind,
            ):
                tokens.append(int(resp.token))
                flags.append(bool(getattr(resp, "from_draft", False)))
                stats = getattr(resp, "spec_stats", None) or stats
            results.append(
                {"tokens": tokens, "from_draft": flags, "stats": stats if isinstance(stats, dict) else None}
            )
        drafts[label] = {"results": results}
    return {"drafts": drafts, "options": options.report(kwargs, unused, req.get("options"))}


def task_cold(req: ColdRequest) -> dict[str, Any]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    t_import = time.time()
    model, _tok = _load(req["model"])
    kwargs, used = _step_options(req)
    t_loaded = time.time()
    prompt = mx.array(req["prompt"])
    next(iter(generate_step(prompt, model, max_tokens=1, sampler=_argmax_sampler(mx), **kwargs)))
    return {
        "t_start": T_START,
        "t_import": t_import,
        "t_loaded": t_loaded,
        "t_first_token": time.time(),
        "options": used,
    }


def task_options(req: dict[str, Any]) -> dict[str, Any]:
    """Which generating tasks would apply each of the request's options in this arm (nothing is run): the check
    reads it before its comparisons, to know which CLI-flag patches they exercise."""
    from mlx_lm.generate import generate_step, speculative_generate_step

    spec_fixed = (*SAMPLER_FIXED, "draft_model", "draft_kind", "num_draft_tokens")
    calls = {"greedy": (generate_step, SAMPLER_FIXED), "spec": (speculative_generate_step, spec_fixed)}
    calls |= {"speed": calls["greedy"], "cold": calls["greedy"], "sample": calls["greedy"]}
    reach: dict[str, list[str]] = {name: [] for name in req.get("options") or {}}
    unused: dict[str, dict[str, str]] = {}
    for task, (fn, fixed) in calls.items():
        kwargs, why = options.split(req.get("options"), fn, fixed=fixed)
        for name in options.report(kwargs, why, req.get("options"))["applied"]:
            reach[name].append(task)
        unused[task] = why
    return {"reach": reach, "unused": unused}


def task_census(req: CensusRequest) -> dict[str, Any]:
    from mlx_lm_census import task_census as census

    return census(req)


TASKS = {name[5:]: fn for name, fn in globals().items() if name.startswith("task_")}


def main() -> None:
    req = json.loads(sys.stdin.read())
    result = TASKS[req["task"]](req)
    result["engine_version"] = __import__("mlx_lm").__version__
    print(json.dumps(result))


if __name__ == "__main__":
    main()
