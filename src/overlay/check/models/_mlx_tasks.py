# mypy: disable-error-code="import-not-found", allow-subclassing-any
"""Training and measuring with mlx, run as a script in an interpreter that has mlx and mlx-lm.

Not imported by overlay: ``overlay.check.models.mlxproc`` runs ``python _mlx_tasks.py`` with one JSON request on stdin
and reads one JSON result from the last line of stdout (logs go to stderr). Needs only mlx, mlx_lm, numpy and the
sibling ``mlx_mtp.py``.

Requests:
- ``{"task": "train_lm", "model": DIR, "data": NPY, "spec": {...}, "seed": N, "out": FILE}``: load DIR with stock
  ``mlx_lm.utils.load_model`` (sanitize included), train every parameter with AdamW on random windows of the token
  stream, save the mlx parameters to FILE (safetensors, mlx names).
- ``{"task": "train_mtp", ...same keys}``: load the (trained) target, freeze it, build the MTP head from the ``mtp.*``
  tensors in DIR, train it by distillation on the target's next-next-token distribution, save the head's parameters
  (names without ``mtp.``, effective norm weights).
- ``{"task": "measure_mtp", "model": DIR, "prompts": [[ids...]...], "max_tokens": N, "k": [1, 3]}``: acceptance of
  the head with the reference speculative loop, and whether its tokens equal stock serial greedy decoding.
- ``{"task": "compare_models", "base": DIR, "other": DIR, "prompts": [[ids...]...], "max_tokens": N}``: whether two
  models give bit-identical prompt logits and identical greedy tokens, and their decode cost (CPU ms per token).
- ``{"task": "measure_draft", "target": DIR, "draft": DIR, "prompts": [...], "max_tokens": N, "k": K}``: stock
  ``speculative_generate_step``: share of tokens from the drafter, identity with serial greedy, time ratio.
"""

from __future__ import annotations

import json
import math
import random
import resource
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx import nn
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mlx_mtp


def cpu_seconds() -> float:
    """User + system CPU time of this process (all threads): a fairer cost than wall time on a busy machine."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def schedule(spec: dict[str, Any]) -> Any:
    peak = spec["learning_rate"]
    warmup = max(1, spec["warmup_steps"])
    decay = optim.cosine_decay(peak, max(1, spec["steps"] - warmup), peak * spec["min_lr_ratio"])
    return optim.join_schedules([optim.linear_schedule(peak / warmup, peak, warmup), decay], [warmup])


def batches(stream: np.ndarray, spec: dict[str, Any], seed: int, width: int) -> Any:
    """Random windows of ``width`` tokens; the order depends only on ``seed`` (Python's stable Random)."""
    rng = random.Random(seed)
    high = len(stream) - width
    for _ in range(spec["steps"]):
        starts = [rng.randrange(0, high) for _ in range(spec["batch_size"])]
        yield mx.array(np.stack([stream[s : s + width] for s in starts]))


def summarise(losses: list[float], every: int = 10) -> list[float]:
    return [
        round(sum(losses[i : i + every]) / len(losses[i : i + every]), 4)
        for i in range(0, len(losses), every)
    ]


def load(model_dir: str) -> tuple[Any, dict[str, Any]]:
    from mlx_lm.utils import load_model

    model, config = load_model(Path(model_dir))
    return model, config


def train_lm(req: dict[str, Any]) -> dict[str, Any]:
    spec, seed = req["spec"], int(req["seed"])
    mx.random.seed(seed)
    model, _ = load(req["model"])
    model.train()
    stream = np.load(req["data"])
    opt = optim.AdamW(learning_rate=schedule(spec), betas=[0.9, 0.95], weight_decay=spec["weight_decay"])

    def loss_fn(m: Any, x: mx.array, y: mx.array) -> mx.array:
        return nn.losses.cross_entropy(m(x), y, reduction="mean")

    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x: mx.array, y: mx.array) -> mx.array:
        loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
        grads, _ = optim.clip_grad_norm(grads, spec["grad_clip"])
        opt.update(model, grads)
        return loss

    losses = []
    started, cpu0 = time.perf_counter(), cpu_seconds()
    for i, batch in enumerate(batches(stream, spec, seed, spec["seq_len"] + 1)):
        loss = step(batch[:, :-1], batch[:, 1:])
        mx.eval(state, loss)
        losses.append(float(loss.item()))
        if i % 20 == 0 or i == spec["steps"] - 1:
            log(f"train_lm step {i} loss {losses[-1]:.4f} ({time.perf_counter() - started:.1f} s)")
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu0
    mx.save_safetensors(req["out"], dict(tree_flatten(model.parameters())))
    return {
        "losses": summarise(losses),
        "steps": spec["steps"],
        "tokens_per_step": spec["batch_size"] * spec["seq_len"],
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu, 3),
    }


def train_mtp(req: dict[str, Any]) -> dict[str, Any]:
    spec, seed = req["spec"], int(req["seed"])
    mx.random.seed(seed)
    model, config = load(req["model"])
    model.freeze()
    head = mlx_mtp.load_head(model, str(Path(req["model"]) / "model.safetensors"), config)
    head.train()
    stream = np.load(req["data"])
    opt = optim.AdamW(learning_rate=schedule(spec), betas=[0.9, 0.95], weight_decay=spec["weight_decay"])

    def loss_fn(h: Any, hidden: mx.array, embeds: mx.array, teacher: mx.array) -> mx.array:
        logp = nn.log_softmax(mlx_mtp.lm_head(model, h(hidden, embeds)), axis=-1)
        return -(teacher * logp).sum(axis=-1).mean()

    text = mlx_mtp.text_model(model)

    def hidden_of(tokens: mx.array) -> mx.array:
        """Target hidden states after the final norm, in chunks (the batch dimension is cheap, positions are not)."""
        chunks = []
        for i in range(0, tokens.shape[0], 128):
            h = text.model(tokens[i : i + 128])
            mx.eval(h)
            chunks.append(h)
        return mx.concatenate(chunks)

    def split(tokens: mx.array, hidden: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        teacher = mx.softmax(mlx_mtp.lm_head(model, hidden[:, 1:]), axis=-1)  # target's dist. of token[t + 2]
        return hidden[:, :-1], mlx_mtp.embed(model, tokens[:, 1:]), teacher

    state = [head.state, opt.state]

    @partial(mx.compile, inputs=[*state, model.state], outputs=state)
    def step(tokens: mx.array, hidden: mx.array) -> mx.array:
        h, embeds, teacher = split(tokens, hidden)
        loss, grads = nn.value_and_grad(head, loss_fn)(head, h, embeds, teacher)
        grads, _ = optim.clip_grad_norm(grads, spec["grad_clip"])
        opt.update(head, grads)
        return loss

    started, cpu0 = time.perf_counter(), cpu_seconds()
    bsz, passes = spec["batch_size"], max(1, spec["passes"])
    distinct = -(-spec["steps"] // passes)
    tokens_all = mx.concatenate(
        list(batches(stream, {**spec, "steps": distinct}, seed + 1, spec["seq_len"] + 1))
    )
    hidden_all = hidden_of(tokens_all)
    hidden_seconds = time.perf_counter() - started
    log(f"train_mtp: target hidden states for {tokens_all.shape[0]} windows ({hidden_seconds:.1f} s)")
    losses = []
    for i in range(spec["steps"]):
        j = i % distinct
        loss = step(tokens_all[j * bsz : (j + 1) * bsz], hidden_all[j * bsz : (j + 1) * bsz])
        mx.eval(state, loss)
        losses.append(float(loss.item()))
        if i % 20 == 0 or i == spec["steps"] - 1:
            log(f"train_mtp step {i} loss {losses[-1]:.4f} ({time.perf_counter() - started:.1f} s)")
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu0

    # top-1 agreement of the head with the target's next-next token on held-out windows (teacher forced)
    head.eval()
    held = next(batches(stream, {**spec, "steps": 1, "batch_size": 32}, seed + 7, spec["seq_len"] + 1))
    hidden, embeds, teacher = split(held, hidden_of(held))
    agree = mx.mean(mx.argmax(mlx_mtp.lm_head(model, head(hidden, embeds)), -1) == mx.argmax(teacher, -1))
    mx.save_safetensors(req["out"], dict(tree_flatten(head.parameters())))
    return {
        "losses": summarise(losses),
        "steps": spec["steps"],
        "tokens_per_step": spec["batch_size"] * spec["seq_len"],
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu, 3),
        "hidden_seconds": round(hidden_seconds, 3),
        "heldout_top1_agreement": round(float(agree.item()), 4),
    }


def measure_mtp(req: dict[str, Any]) -> dict[str, Any]:
    model, config = load(req["model"])
    head = mlx_mtp.load_head(model, str(Path(req["model"]) / "model.safetensors"), config)
    head.eval()
    max_tokens = int(req["max_tokens"])
    results: dict[str, Any] = {}
    started = time.perf_counter()
    serial = [mlx_mtp.serial_greedy(model, p, max_tokens=max_tokens) for p in req["prompts"]]
    for k in req["k"]:
        runs = [
            mlx_mtp.speculative_greedy(model, head, p, max_tokens=max_tokens, k=int(k))
            for p in req["prompts"]
        ]
        drafted = sum(r["drafted"] for r in runs)
        accepted = sum(r["accepted"] for r in runs)
        cycles = sum(r["cycles"] for r in runs)
        per_position = [sum(r["accepted_per_position"][j] for r in runs) for j in range(int(k))]
        results[str(k)] = {
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else math.nan,
            "acceptance_length": round(1 + accepted / cycles, 4) if cycles else math.nan,
            "accepted_per_position": per_position,
            "per_prompt_rate": [
                round(r["accepted"] / r["drafted"], 4) if r["drafted"] else None for r in runs
            ],
            "identical_to_serial": sum(r["tokens"] == s for r, s in zip(runs, serial)),
            "prompts": len(runs),
        }
    return {"k": results, "seconds": round(time.perf_counter() - started, 3)}


def _greedy(x: mx.array) -> mx.array:
    return mx.argmax(x, axis=-1)


def _decode_cost(model: Any, prompt: list[int], n: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per decoded token over ``n`` greedy tokens after a warm-up, median of 3."""
    import importlib

    generate = importlib.import_module("mlx_lm.generate")
    list(generate.generate_step(mx.array(prompt), model, max_tokens=4, sampler=_greedy))
    walls, cpus = [], []
    for _ in range(3):
        t, c = time.perf_counter(), cpu_seconds()
        count = len(list(generate.generate_step(mx.array(prompt), model, max_tokens=n, sampler=_greedy)))
        walls.append(1000 * (time.perf_counter() - t) / count)
        cpus.append(1000 * (cpu_seconds() - c) / count)
    return sorted(walls)[1], sorted(cpus)[1]


def compare_models(req: dict[str, Any]) -> dict[str, Any]:
    base, _ = load(req["base"])
    other, _ = load(req["other"])
    max_tokens = int(req["max_tokens"])
    bit_exact, same, max_abs = True, 0, 0.0
    for prompt in req["prompts"]:
        a, b = base(mx.array([prompt])), other(mx.array([prompt]))
        bit_exact = bit_exact and bool(mx.array_equal(a, b).item())
        max_abs = max(max_abs, float(mx.max(mx.abs(a - b)).item()))
        same += mlx_mtp.serial_greedy(base, prompt, max_tokens=max_tokens) == mlx_mtp.serial_greedy(
            other, prompt, max_tokens=max_tokens
        )
    costs = {name: _decode_cost(m, req["prompts"][0], 64) for name, m in (("base", base), ("other", other))}
    return {
        "logits_bit_exact": bit_exact,
        "logits_max_abs_diff": max_abs,
        "greedy_identical": same,
        "prompts": len(req["prompts"]),
        "decode_ms_per_token": {k: round(v[0], 3) for k, v in costs.items()},
        "decode_cpu_ms_per_token": {k: round(v[1], 3) for k, v in costs.items()},
        "cpu_cost_ratio": round(costs["other"][1] / costs["base"][1], 2),
    }


def measure_draft(req: dict[str, Any]) -> dict[str, Any]:
    import importlib

    generate = importlib.import_module("mlx_lm.generate")
    target, _ = load(req["target"])
    draft, _ = load(req["draft"])
    max_tokens, k = int(req["max_tokens"]), int(req["k"])
    from_draft = total = identical = 0
    spec_s = serial_s = 0.0
    for prompt in req["prompts"]:
        t = time.perf_counter()
        serial = mlx_mtp.serial_greedy(target, prompt, max_tokens=max_tokens)
        serial_s += time.perf_counter() - t
        t = time.perf_counter()
        out = list(
            generate.speculative_generate_step(
                mx.array(prompt), target, draft, num_draft_tokens=k, max_tokens=max_tokens, sampler=_greedy
            )
        )
        spec_s += time.perf_counter() - t
        tokens = [int(tok) for tok, _, _ in out]
        from_draft += sum(bool(flag) for _, _, flag in out)
        total += len(out)
        identical += tokens == serial
    return {
        "k": k,
        "drafted_share": round(from_draft / total, 4),
        "identical_to_serial": identical,
        "prompts": len(req["prompts"]),
        "speculative_over_serial_time": round(spec_s / serial_s, 3),
    }


TASKS = {
    "train_lm": train_lm,
    "train_mtp": train_mtp,
    "measure_mtp": measure_mtp,
    "compare_models": compare_models,
    "measure_draft": measure_draft,
}


def main() -> int:
    req = json.loads(sys.stdin.read())
    task = TASKS.get(req.get("task", ""))
    if task is None:
        log(f"unknown task {req.get('task')!r}; known: {sorted(TASKS)}")
        return 2
    print(json.dumps(task(req)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
