"""The CPU engine path, stock vs patched wheel: a tiny random llama, plain and STANDALONE speculative decoding.

One run_engine.py process per arm (see sglang_support.engine_payload). The patched arm runs with every exact or
lossless flag of the series that the CPU engine reaches; greedy tokens must be identical to stock, speculative
decoding must reproduce plain decoding, and acceptance statistics are reported.
"""

from __future__ import annotations

import json

import pytest
from sglang_support import MAX_NEW_TOKENS, PROMPTS, engine_results, tiny_model, tokens

from overlay.check.envs import Arms

# long: the engine runs behind engine_results (stock and patched, plain and speculative) take ~2.5 minutes on 2 cores
# (scripts/test_long.sh; `overlay check sglang` runs the same comparisons)
pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_stock_cpu_engine_matches_transformers(arms: Arms) -> None:
    """The harness itself: stock SGLang on the CPU test backend decodes like HF transformers (greedy)."""
    stock, _ = engine_results(arms)
    hf = arms.stock.run_json(
        __file__.replace("test_engine.py", "probes/hf_greedy.py"),
        {"model": str(tiny_model()), "prompt": PROMPTS[0], "max_new_tokens": MAX_NEW_TOKENS},
    )
    assert tokens(stock["plain"])[0] == hf["output_ids"]


def test_plain_identical(arms: Arms) -> None:
    """Greedy and a seeded sampled request (temperature 0.8) give the same tokens on both wheels."""
    stock, patched = engine_results(arms)
    assert tokens(patched["plain"]) == tokens(stock["plain"])
    assert all(len(t) == MAX_NEW_TOKENS for t in tokens(stock["plain"]))


def test_standalone_identical_with_acceptance(arms: Arms, capsys: pytest.CaptureFixture[str]) -> None:
    """STANDALONE speculation (3 steps, chain): identical greedy tokens on both wheels and equal to plain greedy;
    acceptance statistics reported and identical (the exact patches change no acceptance decision)."""
    stock, patched = engine_results(arms)
    assert tokens(stock["standalone"])[0] == tokens(stock["plain"])[0]
    assert tokens(patched["standalone"]) == tokens(stock["standalone"])
    for arm_runs in (stock, patched):
        for out in arm_runs["standalone"]["outputs"]:
            meta = out["meta_info"]
            assert meta["spec_verify_ct"] > 0
            assert 1.0 <= meta["spec_accept_length"] <= SPEC_MAX_ACCEPT
    stock_meta = [o["meta_info"] for o in stock["standalone"]["outputs"]]
    patched_meta = [o["meta_info"] for o in patched["standalone"]["outputs"]]
    assert patched_meta == stock_meta
    with capsys.disabled():
        print("\nsglang STANDALONE acceptance (stock == patched):", json.dumps(stock_meta))


SPEC_MAX_ACCEPT = 4.0  # num_steps 3 + bonus token
