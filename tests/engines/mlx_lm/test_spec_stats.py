"""Speculative acceptance statistics (patch generate: report speculative acceptance statistics): stock vs patched.

The same tiny fp32 models (probes/spec_build.py, fixed-seed random weights, built once by the stock arm) and the same
prompts go through both arms (probes/spec_run.py). The patch only counts: tokens and from-draft flags must be
identical in both arms (numerics exact), stock responses have no ``spec_stats``, and the patched counters must agree
with the tokens the generator emitted.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arms

PROBES = Path(__file__).parent / "probes"
BUILD = PROBES / "spec_build.py"
RUN = PROBES / "spec_run.py"
TOKENS = 64
K = 3


def spec_prompts(seed: int = 0, lengths: tuple[int, ...] = (8, 20, 40), vocab: int = 256) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab - 1) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def runs(arms: Arms, models: dict[str, str]) -> dict[str, Any]:
    prompts = spec_prompts()
    base = {
        "target": models["qwen3"],
        "draft": models["qwen3-noisy"],
        "k": K,
        "max_tokens": TOKENS,
        "prompts": prompts,
    }
    cases = [
        {
            "id": "serial",
            "api": "serial",
            "target": models["qwen3"],
            "max_tokens": TOKENS,
            "prompts": prompts,
        },
        {"id": "spec", "api": "spec", "stats": True, **base},
        {"id": "stream", "api": "stream", **base},
    ]
    return {arm.name: arm.run_json(RUN, {"cases": cases})["cases"] for arm in (arms.stock, arms.patched)}


def test_spec_stats_counts_match_tokens(runs: dict[str, Any]) -> None:
    stock, patched = runs["stock"], runs["patched"]
    for case in ("serial", "spec", "stream"):
        assert "error" not in stock[case] and "error" not in patched[case], (stock[case], patched[case])
    for i, serial in enumerate(patched["serial"]["runs"]):
        for case in ("spec", "stream"):
            s, p = stock[case]["runs"][i], patched[case]["runs"][i]
            assert p["tokens"] == s["tokens"] == serial["tokens"], f"{case} prompt {i}"
            assert p["from_draft"] == s["from_draft"], f"{case} prompt {i}: from_draft flags differ"
        assert not stock["stream"]["runs"][i]["has_field"], "stock GenerationResponse has no spec_stats"

        # speculative_generate_step consumed to the end: every counter is exact.
        run = patched["spec"]["runs"][i]
        st = run["stats"]
        flags = run["from_draft"]
        assert st["accepted"] == sum(flags)
        assert st["drafted"] == sum(int(k) * c for k, c in st["k_cycles"].items())
        assert st["cycles"] == sum(st["k_cycles"].values()) == st["position_drafted"][0]
        assert st["emitted"] == st["accepted"] + st["cycles"]
        assert st["emitted"] - len(flags) in (0, 1)  # the last target token may fall past max_tokens
        assert len(st["position_drafted"]) == K
        assert all(0 <= a <= d for a, d in zip(st["position_accepted"], st["position_drafted"]))
        assert sum(st["position_accepted"]) == st["accepted"]
        assert st["acceptance_rate"] == pytest.approx(st["accepted"] / st["drafted"])
        assert st["acceptance_length"] == pytest.approx((st["accepted"] + st["cycles"]) / st["cycles"])
        assert 0 < st["acceptance_rate"] < 1, "the noisy drafter should be partly accepted"
        assert st["draft_kind"] == "model" and st["serial_tokens"] == 0 and st["k"] in range(1, K + 1)

        # stream_generate attaches the same statistics (it stops reading at max_tokens).
        streamed = patched["stream"]["runs"][i]
        assert streamed["has_field"] and streamed["stats"] == st
