"""The sampling-distribution check at temperature > 0: for each prompt and each of the first P positions, the tokens
the patched engine samples over many seeds against the stock engine's, a chi-square homogeneity test per position
(overlay.check.stats.homogeneity). A lossless patch must leave these distributions equal; the gate rejects when any
position's p-value is below alpha / (number of tests) (Bonferroni, alpha = 0.01). Seeds are the same in both arms, so
an exact patch also samples the same tokens seed for seed (reported as ``identical_runs``).

Samplers (workers/, run in each arm): mlx-lm reseeds mlx's generator before each run (sample_mlx_lm.py); SGLang's CPU
engine path serves all runs as one batch of one engine seeded with the first seed (sample_sglang.py: per-request
seeds need SGLang's deterministic inference, which its CPU attention backend refuses), so its runs are independent
draws and match across arms only while both engines schedule the same batches; vLLM's CPU build runs every (prompt,
seed) as a request with its own seed, all in one batch of one engine (sample_vllm.py), so its runs match stock seed for
seed under an exact patch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlay.check import stats
from overlay.check.envs import Arm

WORKERS = Path(__file__).parent / "workers"
SAMPLERS = {
    "mlx-lm": WORKERS / "sample_mlx_lm.py",
    "sglang": WORKERS / "sample_sglang.py",
    "vllm": WORKERS / "sample_vllm.py",
}
SEEDED_PER_RUN = {"mlx-lm": True, "sglang": False, "vllm": True}
"""Whether the engine's sampler reseeds each run (then an exact patch matches stock seed for seed), or draws every run
from one engine seeded once (runs match only while both arms schedule the same batches)."""
ALPHA = 0.01
SAMPLE_PROMPTS = 4  # the first prompts of the set


def available(engine: str) -> bool:
    return engine in SAMPLERS


def run_sampler(
    engine: str,
    arm: Arm,
    model: Path,
    prompt_ids: list[list[int]],
    *,
    temperature: float,
    seeds: list[int],
    positions: int,
    options: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The engine's sampling worker's whole result (``tokens`` and the worker's own fields); ``extra``: fields of that
    worker's request (sample_vllm.py: ``params``, ``speculative``)."""
    req: dict[str, Any] = {
        "model": str(model),
        "prompts": prompt_ids,
        "temperature": temperature,
        "seeds": seeds,
        "positions": positions,
        **extra,
    }
    if options:
        req["options"] = options
    result: dict[str, Any] = arm.run_json(SAMPLERS[engine], req, timeout=1800)
    return result


def sample(
    engine: str, arm: Arm, model: Path, prompt_ids: list[list[int]], **kwargs: Any
) -> list[list[list[int]]]:
    """The sampled tokens, [prompt][run] -> the first ``positions`` tokens (``run_sampler``'s keywords)."""
    tokens: list[list[list[int]]] = run_sampler(engine, arm, model, prompt_ids, **kwargs)["tokens"]
    return tokens


def compare(
    stock: list[list[list[int]]],
    patched: list[list[list[int]]],
    *,
    categories: list[str],
    temperature: float,
    positions: int,
    seeded: bool = True,
    alpha: float = ALPHA,
) -> dict[str, Any]:
    """Per prompt and position: the chi-square test of stock's vs patched's sampled tokens."""
    tests = []
    identical = total = 0
    for pi, (a_runs, b_runs) in enumerate(zip(stock, patched)):
        for a, b in zip(a_runs, b_runs):
            total += 1
            identical += a == b
        for t in range(positions):
            a_tok = [r[t] for r in a_runs if len(r) > t]
            b_tok = [r[t] for r in b_runs if len(r) > t]
            h = stats.homogeneity(a_tok, b_tok)
            tests.append({"prompt": pi, "category": categories[pi], "position": t, **h})
    informative = [t for t in tests if t["df"] > 0]
    threshold = alpha / max(1, len(informative))
    worst = min(informative, key=lambda t: t["p"]) if informative else None
    return {
        "temperature": temperature,
        "seeds": len(stock[0]) if stock else 0,
        "prompts": len(stock),
        "positions": positions,
        "tests": tests,
        "informative_tests": len(informative),
        "alpha": alpha,
        "threshold": threshold,
        "min_p": worst["p"] if worst else 1.0,
        "worst": worst,
        "equal": all(t["p"] >= threshold for t in informative),
        "identical_runs": identical,
        "runs": total,
        "seeded": seeded,
    }


def identical_label(result: dict[str, Any]) -> str:
    """What ``identical_runs`` counts: the same seed in both arms, or the same draw of one engine seeded once."""
    return (
        "runs identical seed for seed"
        if result.get("seeded", True)
        else "runs identical draw for draw (one seeded engine per arm)"
    )


def gate(result: dict[str, Any], cls: str) -> dict[str, Any]:
    w = result["worst"]
    where = f"; lowest p {w['p']:.3g} at prompt {w['prompt']} position {w['position']}" if w else ""
    return {
        "subject": "series",
        "class": cls,
        "gate": f"sampling distribution at T={result['temperature']:g} equals stock's",
        "passed": bool(result["equal"]),
        "detail": f"{result['informative_tests']} chi-square tests over {result['seeds']} runs per prompt, "
        f"Bonferroni threshold {result['threshold']:.2g}{where}; {identical_label(result)}: "
        f"{result['identical_runs']}/{result['runs']}",
    }
