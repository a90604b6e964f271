"""The hybrid qwen3_5 in the real vLLM V1 engine of the CPU build, stock vs the series (long: two greedy runs, two MTP
runs and one census, ~5 minutes on the 2-core machine; the trained ``qwen3_5-mtp-gdn64`` is built with the stock
mlx-lm arm on first use).

vLLM 0.32.0 runs it with the worker's ``model_settings``: bfloat16 (the CPU gated-delta kernels take nothing else),
text only (``language_model_only``: no vision tower) and the labelled torchvision stub of the vLLM CPU harness (vLLM's
qwen3_5 module imports torchvision on its text path). Greedy decoding must be stock's token for token and logprob for
logprob; speculative decoding with the checkpoint's own trained MTP head (vLLM's "mtp" method) must accept drafts, be
the same in both arms request for request, and leave serial greedy only where serial's top-2 margin is a bfloat16 tie
(the verify step's batched arithmetic breaks it the other way); the stub is never called and the vision tower holds no
weights. The census counts the hybrid-only wait on the accepted-token counts in the spec step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_support import census, hybrid_model, tokenized_prompts

from overlay.check.envs import Arms
from overlay.check.steps import divergences
from overlay.engines import get_adapter
from overlay.schemas.documents import GreedyRequest, SpecRequest

pytestmark = pytest.mark.long
MAX_TOKENS = 48
TIE = 0.125  # one rounding step of a bfloat16 logit between 16 and 32 (0.0625 between 8 and 16)
STUB = "overlay vLLM CPU test harness"


@pytest.fixture(scope="module")
def model() -> Path:
    return hybrid_model()


@pytest.fixture(scope="module")
def prompts(arms: Arms, model: Path) -> list[list[int]]:
    return tokenized_prompts(arms, model)


@pytest.fixture(scope="module")
def greedy(
    arms: Arms, model: Path, prompts: list[list[int]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    request: GreedyRequest = {
        "task": "greedy",
        "model": str(model),
        "prompts": prompts,
        "max_tokens": MAX_TOKENS,
        "out": str(tmp_path_factory.mktemp("greedy")),
    }
    return {
        name: get_adapter("vllm").run(arm, request)
        for name, arm in (("stock", arms.stock), ("patched", arms.patched))
    }


@pytest.fixture(scope="module")
def mtp(arms: Arms, model: Path, prompts: list[list[int]]) -> dict[str, dict[str, Any]]:
    request: SpecRequest = {
        "task": "spec",
        "model": str(model),
        "drafts": {"mtp": "mtp"},
        "prompts": prompts,
        "k": 3,
        "max_tokens": MAX_TOKENS,
    }
    return {
        name: get_adapter("vllm").run(arm, request)
        for name, arm in (("stock", arms.stock), ("patched", arms.patched))
    }


def test_greedy_on_the_hybrid_is_stocks(greedy: dict[str, dict[str, Any]]) -> None:
    stock, patched = greedy["stock"], greedy["patched"]
    assert patched["outputs"] == stock["outputs"]
    assert patched["margins"] == stock["margins"]  # top-1 minus top-2 logprob, every step, bit for bit
    assert all(len(o) == MAX_TOKENS for o in stock["outputs"])
    for run in (stock, patched):
        settings = run["settings"]
        assert settings["hybrid"] and settings["mtp"]
        assert settings["engine_args"] == {"dtype": "bfloat16", "language_model_only": True}


def test_the_stub_is_labelled_and_the_vision_tower_never_runs(
    greedy: dict[str, dict[str, Any]], mtp: dict[str, dict[str, Any]]
) -> None:
    for run in (*greedy.values(), *mtp.values()):
        stub = run["settings"]["standin"]
        assert stub["torchvision"] == STUB
        assert "torchvision.transforms.v2.functional" in stub["modules"]  # transformers' qwen2_vl processors
        assert stub["calls"] == []  # no torchvision function ran (a call raises and is recorded)
    for run in greedy.values():
        # language_model_only: vLLM left the tower out (StageMissingLayer: calling it raises), no weight loaded
        assert run["vision_tower"] == {"class": "StageMissingLayer", "stage": "vision_tower", "parameters": 0}


def test_mtp_speculation_accepts_and_is_serial_greedy_but_for_ties(
    greedy: dict[str, dict[str, Any]], mtp: dict[str, dict[str, Any]]
) -> None:
    runs = {name: run["drafts"]["mtp"] for name, run in mtp.items()}
    stock, patched = runs["stock"], runs["patched"]
    assert stock["method"] == "mtp" and stock["counters_consistent"] and patched["counters_consistent"]
    # the same tokens and the same acceptance, request for request, in both arms
    assert [r["tokens"] for r in patched["results"]] == [r["tokens"] for r in stock["results"]]
    assert [r["stats"] for r in patched["results"]] == [r["stats"] for r in stock["results"]]
    accepted = sum(r["stats"]["accepted"] for r in stock["results"])
    drafted = sum(r["stats"]["drafted"] for r in stock["results"])
    assert accepted / drafted > 0.3  # the trained head: 608 of 1062 measured
    assert sum(r["stats"]["histogram"][-1] for r in stock["results"]) > 0  # whole drafts accepted too
    serial = greedy["stock"]
    tokens = [r["tokens"] for r in stock["results"]]
    left = divergences(tokens, serial["outputs"], serial["margins"])
    assert len(left) <= len(tokens) // 4, left
    assert all(d["serial_margin"] <= TIE for d in left), left


def test_the_census_counts_the_hybrids_accepted_count_wait(arms: Arms, model: Path) -> None:
    run = census(arms.stock, model, "spec-verify-step", steps=2, extra={"draft": "mtp"})
    assert run["detail"]["draft"] == "mtp" and run["detail"]["drafts"] == [12, 12]  # 4 requests x k=3
    syncs = dict(run["sites"]["host-syncs"])
    # gpu_model_runner._prepare_inputs: num_accepted_tokens_event.synchronize(), recorded only for hybrid models;
    # _get_draft_token_ids_cpu: draft_token_ids_event.synchronize(), the MTP drafter's ids to the host
    assert syncs.get("vllm/v1/worker/gpu_model_runner.py:2072") == 2
    assert syncs.get("vllm/v1/worker/gpu_model_runner.py:4678") == 2
    assert run["standin"] is not None and "0 calls" in run["standin"]
