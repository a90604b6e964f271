"""The check's sampling-distribution test on vLLM's CPU build (overlay.check.sampling, check/workers/sample_vllm.py),
and with it sampled speculative decoding against serial sampling. Long: four engine runs of 480 seeded requests on
llama-target, ~1 minute each on the 2-core machine.

- serial sampling (temperature 1.0, top-k 20, top-p 0.95), stock vs the series with 0006's flag: the same distribution
  at each of the first 4 positions (chi-square), and seed for seed the same tokens (0006 is stock's output bit for bit);
- n-gram speculative sampling in the series (0009), 0010's flag off and on, against the series' serial sampling: the
  same distribution at each position (the rejection sampler is lossless in distribution; its random numbers are not
  the serial sampler's, so the runs are not compared seed for seed), with drafts proposed and accepted.

Without 0009 the speculative runs die (stock: "index ... is out of bounds", tests/engines/vllm/test_vllm_spec_sampled.py);
a rejection sampler that drew recovered tokens from the wrong distribution fails the chi-square tests here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import vllm_support
from tokenizers import Tokenizer

from overlay.check import sampling
from overlay.check.envs import Arm, Arms

pytestmark = pytest.mark.long
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "src" / "overlay" / "engines" / "workers"))

import vllm_census  # noqa: E402  (a worker script's module, from its folder: the census's n-gram prompts)

PARAMS = {"top_k": 20, "top_p": 0.95}
TEMPERATURE = 1.0  # llama-target is nearly certain of the census's phrases at 0.7 (one distinct run in 120)
SEEDS = list(range(1, 121))
POSITIONS = 4
INFORMATIVE = 8  # of the 16 (prompt, position) tests, at least this many have two categories to compare
PRESELECT = {"VLLM_OVL_TOPK_TOPP_PRESELECT": "1"}
RECOVER = {"VLLM_OVL_RECOVER_AT_REJECTION": "1"}


@pytest.fixture(scope="module")
def model() -> Path:
    """llama-target: peaked next-token distributions, so 120 runs fill the chi-square cells."""
    return vllm_support.trained_target()


@pytest.fixture(scope="module")
def prompts(model: Path) -> list[list[int]]:
    """The census's four repeated phrases: the n-gram proposer drafts from the prompt from the first step on."""
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    return [tok.encode(text).ids for text in vllm_census.SPEC_PROMPTS]


def run(arm: Arm, model: Path, prompts: list[list[int]], speculative: str | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {"params": PARAMS} | ({"speculative": speculative} if speculative else {})
    return sampling.run_sampler(
        "vllm", arm, model, prompts, temperature=TEMPERATURE, seeds=SEEDS, positions=POSITIONS, **extra
    )


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return sampling.compare(
        a["tokens"],
        b["tokens"],
        categories=["phrase"] * len(a["tokens"]),
        temperature=TEMPERATURE,
        positions=POSITIONS,
    )


@pytest.fixture(scope="module")
def runs(arms: Arms, model: Path, prompts: list[list[int]]) -> dict[str, dict[str, Any]]:
    series = arms.patched.with_env(PRESELECT)
    return {
        "stock": run(arms.stock, model, prompts),
        "serial": run(series, model, prompts),
        "spec": run(series, model, prompts, "ngram"),
        "spec recover": run(series.with_env(RECOVER), model, prompts, "ngram"),
    }


def test_serial_sampling_is_stocks_seed_for_seed(runs: dict[str, dict[str, Any]]) -> None:
    stock, serial = runs["stock"], runs["serial"]
    assert stock["seeded"] and [len(r) for r in stock["tokens"]] == [len(SEEDS)] * 4
    assert all(len(t) == POSITIONS for r in stock["tokens"] for t in r)
    assert max(len({tuple(t) for t in r}) for r in stock["tokens"]) > 10  # the seeds draw different runs
    result = compare(stock, serial)
    assert result["equal"] and result["informative_tests"] >= INFORMATIVE, result["worst"]
    assert serial["tokens"] == stock["tokens"]


@pytest.mark.parametrize("label", ["spec", "spec recover"])
def test_speculative_sampling_is_distributed_as_serial(runs: dict[str, dict[str, Any]], label: str) -> None:
    spec = runs[label]
    assert spec["spec"]["draft_tokens"] > 0 and spec["spec"]["accepted_tokens"] > 0, spec["spec"]
    result = compare(runs["serial"], spec)
    assert result["informative_tests"] >= INFORMATIVE and result["equal"], result["worst"]
    assert spec["tokens"] != runs["serial"]["tokens"]  # other random numbers: not the serial sampler's draws
