"""Runs inside an SGLang arm (stock or patched venv, CPU engine path) for `overlay check`. Not imported by overlay.

Protocol as the other workers: one JSON request on stdin, one JSON document on stdout. Engines are started with the
CPU harness (src/overlay/testbackends/sglang/run_engine.py: test infrastructure) so the same settings are used as in
the per-patch tests. Tasks: tokenize, greedy, logits, spec, speed, cold.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

T_START = time.time()
HARNESS = Path(__file__).resolve().parents[2] / "testbackends" / "sglang"
sys.path.insert(0, str(HARNESS))

import run_engine  # noqa: E402  (test infrastructure: engine settings, AMX forcing for spec runs)


def _engine(model: str, spec: dict[str, Any] | None = None) -> Any:
    import sglang

    run: dict[str, Any] = {"name": "check"}
    if spec:
        run["spec"] = spec
        run_engine._force_amx_platform()
    return sglang.Engine(**run_engine._engine_kwargs({"model": model, "dtype": "float32"}, run))


def _greedy_params(n: int) -> dict[str, Any]:
    return {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}


def task_tokenize(req: dict[str, Any]) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(req["model"]) / "tokenizer.json"))
    return {"ids": [tok.encode(p).ids for p in req["prompts"]], "vocab_size": tok.get_vocab_size()}


def _margins(top: list[Any]) -> list[float]:
    out = []
    for entry in top:
        vals = sorted((float(e[0]) for e in entry if e is not None and e[0] is not None), reverse=True)
        out.append(vals[0] - vals[1] if len(vals) >= 2 else float("inf"))
    return out


def task_greedy(req: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    engine = _engine(req["model"])
    try:
        res = engine.generate(input_ids=req["prompts"], sampling_params=_greedy_params(req["max_tokens"]),
                              return_logprob=True, top_logprobs_num=2)
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


def task_logits(req: dict[str, Any]) -> dict[str, Any]:
    """Teacher-forced log-probabilities of every input position over the whole vocabulary (input_top_logprobs with
    top_logprobs_num = vocabulary size; the tiny models' vocabularies make that affordable)."""
    import numpy as np

    vocab = int(req["vocab_size"])
    engine = _engine(req["model"])
    files = []
    try:
        for i, seq in enumerate(req["sequences"]):
            r = engine.generate(input_ids=[seq[:-1] + [seq[-1]]], sampling_params=_greedy_params(1),
                                return_logprob=True, logprob_start_len=0, top_logprobs_num=vocab)[0]
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


def task_spec(req: dict[str, Any]) -> dict[str, Any]:
    k = int(req["k"])
    results: dict[str, Any] = {}
    for label, draft in req["drafts"].items():
        spec = {"algorithm": "STANDALONE", "draft_model": draft, "num_steps": k, "topk": 1, "num_draft_tokens": k + 1}
        engine = _engine(req["model"], spec)
        try:
            res = engine.generate(input_ids=req["prompts"], sampling_params=_greedy_params(req["max_tokens"]))
        finally:
            engine.shutdown()
        runs = []
        for r in res:
            meta = r["meta_info"]
            tokens = [int(t) for t in r["output_ids"]]
            cycles = int(meta.get("spec_verify_ct") or 0)
            if meta.get("spec_accept_token_num") is not None and meta.get("spec_draft_token_num") is not None:
                accepted, drafted = int(meta["spec_accept_token_num"]), int(meta["spec_draft_token_num"])
            else:  # the first token comes from the target's prefill; each verify emits its accepted drafts + 1
                accepted, drafted = max(len(tokens) - 1 - cycles, 0), cycles * k
            runs.append({"tokens": tokens, "from_draft": [],
                         "stats": {"accepted": accepted, "drafted": drafted, "cycles": cycles,
                                   "histogram": run_engine._jsonable(meta.get("spec_correct_drafts_histogram"))}})
        results[label] = {"results": runs}
    return {"drafts": results}


def task_speed(req: dict[str, Any]) -> dict[str, Any]:
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
    return {"prefill_tok_s": statistics.median(s[0] for s in samples),
            "decode_tok_s": statistics.median(s[1] for s in samples)}


def task_cold(req: dict[str, Any]) -> dict[str, Any]:
    engine = _engine(req["model"])
    try:
        engine.generate(input_ids=[req["prompt"]], sampling_params=_greedy_params(1))
        t_first = time.time()
    finally:
        engine.shutdown()
    return {"t_start": T_START, "t_first_token": t_first}


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
