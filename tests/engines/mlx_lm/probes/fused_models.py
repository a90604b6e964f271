"""Probe: tiny models through stock or patched mlx-lm, one process per arm and setting.

Payload: {"root": models folder (shared by the arms), "out": folder for .npy files, "cases": [case, ...]}.
A case: {"id", "family", "quantize": null | {"group_size", "bits"}, "env": {VAR: value} set while the model loads,
"globals": {"module:ATTR": value} set while the case runs (only where the module has ATTR), "count": bool,
"prompt_len", "steps", "chunk": prefill chunk (0: one call), "greedy": [[prompt seed, prompt length, tokens], ...],
"count_toggles": {"label": {"module:ATTR": value}}, "index_sets": bool, "spec": null | {"drafts": [family, ...], "k",
"tokens", "prompts": [[seed, length], ...]}, "batch": [[seed, length], ...] (BatchGenerator), "batch_tokens"}.

Per case the result holds: "primitives" (one greedy decode step of generate_step), "toggled" (primitives with each
toggle), "greedy" (token lists), "logits" (.npy of the prefill + decode-step logits, fp32), "index_sets" (.npy of the
sparse-attention indexer selections, each row sorted), "spec" (tokens and from-draft flags of
speculative_generate_step, and primitives of one draft step), "batch_tokens" / "batch_logprobs" (.npy) of continuous
batching, "applied" (globals that exist in this arm).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import mlx.core as mx
import numpy as np
from fused_common import (
    count_primitives,
    ensure_model,
    greedy_step_primitives,
    load,
    logits_rollout,
    prompt_tokens,
)
from probe_io import emit, env_override, log, patched_globals, read_payload


def _greedy(model: Any, seed: int, length: int, n: int) -> list[int]:
    from mlx_lm.generate import generate_step

    out = []
    for tok, _ in generate_step(prompt_tokens(seed, length), model, max_tokens=n):
        out.append(int(tok))
    return out


def _batch(model: Any, prompts: list[list[int]], n: int) -> tuple[list[list[int]], np.ndarray]:
    """Greedy continuous batching (BatchGenerator, as the server runs it): tokens and log-probabilities per prompt."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, max_tokens=n)
    try:
        uids = gen.insert([np.array(prompt_tokens(s, length)).tolist() for s, length in prompts])
        toks: dict[int, list[int]] = {u: [] for u in uids}
        lps: dict[int, list[np.ndarray]] = {u: [] for u in uids}
        done: set[int] = set()
        while len(done) < len(uids):
            for r in gen.next_generated():
                toks[r.uid].append(int(r.token))
                lps[r.uid].append(np.array(r.logprobs.astype(mx.float32)))
                if r.finish_reason:
                    done.add(r.uid)
    finally:
        gen.close()
    return [toks[u] for u in uids], np.stack([np.stack(lps[u]) for u in uids])


def _spec(model: Any, drafts: list[Any], spec: dict[str, Any]) -> dict[str, Any]:
    from mlx_lm.generate import speculative_generate_step

    runs = []
    for draft in drafts:
        for seed, length in spec["prompts"]:
            toks, flags = [], []
            for tok, _, from_draft in speculative_generate_step(
                prompt_tokens(seed, length),
                model,
                draft,
                num_draft_tokens=spec["k"],
                max_tokens=spec["tokens"],
            ):
                toks.append(int(tok))
                flags.append(bool(from_draft))
            runs.append({"tokens": toks, "from_draft": flags})
    draft = drafts[0]

    # Primitives of one draft token: the first async_eval of the loop is the first draft step.
    counted: list[dict[str, Any]] = []
    real = mx.async_eval

    def fake_async_eval(*arrays: Any) -> None:
        if not counted:
            counted.append(count_primitives(*[a for a in arrays if isinstance(a, mx.array)]))
        mx.eval(*arrays)

    mx.async_eval = fake_async_eval
    try:
        seed, length = spec["prompts"][0]
        for _ in speculative_generate_step(
            prompt_tokens(seed, length), model, draft, num_draft_tokens=spec["k"], max_tokens=2
        ):
            pass
    finally:
        mx.async_eval = real
    return {"runs": runs, "draft_step_primitives": counted[0] if counted else None}


class _IndexRecorder:
    """Records the indices each sparse-attention indexer call returns (rows sorted)."""

    def __init__(self) -> None:
        self.sets: list[np.ndarray] = []
        self.cls: Any = None
        self.real: Any = None

    def __enter__(self) -> Self:
        from mlx_lm.models import deepseek_v32

        self.cls = deepseek_v32.Indexer
        self.real = self.cls.__call__
        recorder = self

        def wrapped(this: Any, *args: Any, **kwargs: Any) -> Any:
            out = recorder.real(this, *args, **kwargs)
            if out is not None:
                recorder.sets.append(np.sort(np.array(out), axis=-1))
            return out

        self.cls.__call__ = wrapped
        return self

    def __exit__(self, *exc: object) -> None:
        self.cls.__call__ = self.real


def run_case(case: dict[str, Any], root: Path, out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    with patched_globals(case.get("globals", {})) as applied:
        res["applied"] = applied
        with env_override(case.get("env", {})):  # the env is read while loading only
            path = ensure_model(root, case["family"], quantize=case.get("quantize"))
            model = load(path)
            res["layer_types"] = sorted({type(m).__name__ for m in model.modules()})
        if case.get("count"):
            res["primitives"] = greedy_step_primitives(model, prompt_tokens(0, case.get("prompt_len", 24)))[
                "total"
            ]
            toggled = {}
            for label, spec in case.get("count_toggles", {}).items():
                with patched_globals(spec) as app:
                    if app:
                        toggled[label] = greedy_step_primitives(
                            model, prompt_tokens(0, case.get("prompt_len", 24))
                        )["total"]
            res["toggled"] = toggled
        if case.get("steps"):
            if case.get("index_sets"):
                with _IndexRecorder() as rec:
                    logits, toks = logits_rollout(
                        model, prompt_tokens(1, case["prompt_len"]), case["steps"], case.get("chunk", 0)
                    )
                res["index_sets"] = []
                for i, arr in enumerate(rec.sets):
                    f = out / f"{case['id']}-index-{i}.npy"
                    np.save(f, arr)
                    res["index_sets"].append(str(f))
            else:
                logits, toks = logits_rollout(
                    model, prompt_tokens(1, case["prompt_len"]), case["steps"], case.get("chunk", 0)
                )
            f = out / f"{case['id']}-logits.npy"
            np.save(f, logits)
            res["logits"] = str(f)
            res["rollout_tokens"] = toks
        res["greedy"] = [_greedy(model, s, n, t) for s, n, t in case.get("greedy", [])]
        if case.get("batch"):
            res["batch_tokens"], lps = _batch(model, case["batch"], case.get("batch_tokens", 12))
            f = out / f"{case['id']}-batch-logprobs.npy"
            np.save(f, lps)
            res["batch_logprobs"] = str(f)
        if case.get("spec"):
            drafts = [load(ensure_model(root, name)) for name in case["spec"]["drafts"]]
            res["spec"] = _spec(model, drafts, case["spec"])
    return res


def main() -> None:
    payload = read_payload()
    root, out = Path(payload["root"]), Path(payload["out"])
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for case in payload["cases"]:
        log(f"case {case['id']}")
        results[case["id"]] = run_case(case, root, out)
    emit({"version": 1, "cases": results})


if __name__ == "__main__":
    main()
