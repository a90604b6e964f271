"""Logits processors in speculative decoding see the prompt, as in serial decoding: stock vs patched.

``generate_step`` gives its logits processors (repetition, presence, frequency penalties, logit bias) the prompt and
the generated tokens; stock ``speculative_generate_step`` starts their history empty, so with a repetition penalty
its greedy tokens differ from serial decoding. Tiny context-sensitive Qwen3 and hybrid Qwen3.5 targets with noisy
drafters (probes/spec_build.py), three prompts x 64 tokens, repetition penalty 1.3 over 20 tokens: patched tokens
must equal serial decoding with the same processors (numerics lossless); without processors, stock and patched
speculation stay identical.
"""

from __future__ import annotations

from typing import Any

from test_spec_stats import RUN, spec_prompts

from overlay.check.envs import Arms

TOKENS = 64
PENALTY = {"repetition_penalty": 1.3, "repetition_context_size": 20}


def test_processors_see_prompt(arms: Arms, models: dict[str, str]) -> None:
    prompts = spec_prompts(5)
    cases: list[dict[str, Any]] = []
    for target, draft in (("qwen3", "qwen3-noisy"), ("hybrid", "hybrid-noisy")):
        base = {"target": models[target], "max_tokens": TOKENS, "prompts": prompts}
        cases.append({"id": f"{target}/serial", "api": "serial", "processors": PENALTY, **base})
        cases.append({"id": f"{target}/serial-plain", "api": "serial", **base})
        for k in (2, 3):
            spec = {"api": "spec", "draft": models[draft], "k": k, **base}
            cases.append({"id": f"{target}/k{k}", "processors": PENALTY, **spec})
            cases.append({"id": f"{target}/k{k}-plain", **spec})
        cases.append(
            {
                "id": f"{target}/adaptive",
                "processors": PENALTY,
                "api": "spec",
                "draft": models[draft],
                "k": 3,
                "kwargs": {"adaptive_draft": True},
                **base,
            }
        )
    stock = arms.stock.run_json(RUN, {"cases": cases})["cases"]
    patched = arms.patched.run_json(RUN, {"cases": cases})["cases"]

    stock_diverged = 0
    for target in ("qwen3", "hybrid"):
        ref = [r["tokens"] for r in stock[f"{target}/serial"]["runs"]]
        plain = [r["tokens"] for r in stock[f"{target}/serial-plain"]["runs"]]
        assert ref != plain, "the penalty must change the output for this check to mean anything"
        for case in (f"{target}/k2", f"{target}/k3", f"{target}/adaptive"):
            assert [r["tokens"] for r in patched[case]["runs"]] == ref, case
        for k in (2, 3):
            assert [r["tokens"] for r in patched[f"{target}/k{k}-plain"]["runs"]] == plain
            if target == "qwen3":  # stock runs these (it refuses the hybrid target)
                stock_runs = stock[f"{target}/k{k}"]["runs"]
                stock_diverged += sum(r["tokens"] != x for r, x in zip(stock_runs, ref))
                assert [r["tokens"] for r in stock[f"{target}/k{k}-plain"]["runs"]] == plain
    assert stock_diverged > 0, "stock speculation with processors should differ from serial decoding"
