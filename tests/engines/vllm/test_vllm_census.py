"""The mechanism census in vLLM's real call path (workers/vllm_census.py through the worker's census task), stock arm
of the CPU build, on the tiny random llama (long: each scenario is one engine start, ~20-60 s on the 2-core machine)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arm, arms_for
from overlay.engines import get_adapter
from overlay.schemas.documents import GreedyRequest, TokenizeRequest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "src" / "overlay" / "engines" / "workers"))
pytestmark = pytest.mark.long

import vllm_census  # noqa: E402  (the worker's module: its prompts)
import vllm_support  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def stock() -> Arm:
    return arms_for(REPO, "vllm").stock


def census(arm: Arm, model: Path, scenario: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return vllm_support.census(arm, model, scenario, env=env, steps=STEPS)


def greedy(arm: Arm, model: Path, prompts: list[list[int]], n: int, out: Path) -> list[list[int]]:
    request: GreedyRequest = {
        "task": "greedy",
        "model": str(model),
        "prompts": prompts,
        "max_tokens": n,
        "out": str(out),
    }
    outputs: list[list[int]] = get_adapter("vllm").run(arm, request)["outputs"]
    return outputs


def assert_counted_in_vllm(doc: dict[str, Any], scenario: str, *, judged: bool = True) -> None:
    assert doc["scenario"] == scenario and doc["steps"] == STEPS
    assert doc["engine_version"] == "0.32.0"
    assert doc["detail"]["runner"] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
    m = doc["metrics"] if judged else doc["detail"]["uncounted"]
    assert m["host-syncs"] >= 1 and m["h2d-copies"] >= 1 and m["eager-launches"] > 10
    assert m["bytes-moved"] > 0 and m["peak-memory"] > 0
    assert m["pageable-copies"] == 0  # the runner's host buffers are pinned on CUDA, and counted so
    if judged:
        assert m["collectives"] is None and m["capturable"] is None  # not counted here, with the reason
        assert any(n.startswith("capturable: not counted") for n in doc["notes"])
    for metric in ("host-syncs", "h2d-copies", "eager-launches"):
        assert doc["sites"][metric] and all(site.startswith("vllm/") for site, _ in doc["sites"][metric])
    # the CpuGpuBuffer copies are charged to the line that asks for them, not to vllm/v1/utils.py
    assert not any(site.startswith("vllm/v1/utils.py") for site, _ in doc["sites"]["h2d-copies"])


def test_decode_step_is_stable_and_keeps_the_outputs(stock: Arm, model: Path, tmp_path: Path) -> None:
    first, second = census(stock, model, "decode-step"), census(stock, model, "decode-step")
    assert_counted_in_vllm(first, "decode-step")
    per_step = first["detail"]["per_step"]
    counted = ("host-syncs", "h2d-copies", "eager-launches", "bytes-moved")
    assert all(step[k] == per_step[0][k] for step in per_step for k in counted)  # every decode step alike
    assert first["metrics"] == second["metrics"] and first["sites"] == second["sites"]  # and run to run
    # the sampled ids' host read (cpu_model_runner.py _to_list) is the decode step's one sync
    assert [site.split(":")[0] for site, _ in first["sites"]["host-syncs"]] == [
        "vllm/v1/worker/cpu_model_runner.py"
    ]
    # the census's split buffers change nothing: the tokens are what plain greedy generation gives
    ids = first["detail"]["tokens"]
    prompts, _ = vllm_census._workload("decode-step", STEPS, str(model))
    assert greedy(stock, model, prompts, len(ids[0]), tmp_path) == ids


def test_prefill_chunk_counts_full_chunks_and_an_unread_switch_is_not_measured(
    stock: Arm, model: Path
) -> None:
    doc = census(stock, model, "prefill-chunk", {"VLLM_OVL_NOT_A_SWITCH": "1"})
    # a switch the engine never reads: every metric is "not measured", never a silent "unchanged"
    assert set(doc["metrics"].values()) == {None}
    assert any("VLLM_OVL_NOT_A_SWITCH set but never read" in n for n in doc["notes"])
    assert_counted_in_vllm(doc, "prefill-chunk", judged=False)
    assert doc["detail"]["step_kinds"][: 1 + STEPS] == ["prefill-chunk"] * (1 + STEPS)
    per_step = doc["detail"]["per_step"]
    assert all(step["eager-launches"] == per_step[0]["eager-launches"] for step in per_step)


def test_spec_verify_step_runs_ngram_drafts(stock: Arm, model: Path, tmp_path: Path) -> None:
    doc = census(stock, model, "spec-verify-step")
    assert_counted_in_vllm(doc, "spec-verify-step")
    assert any(n.startswith("n-gram speculative") for n in doc["notes"])
    assert len(doc["detail"]["drafts"]) == STEPS and all(n > 0 for n in doc["detail"]["drafts"])
    # the rejection sampler's host read of the accepted ids replaces the plain decode step's
    files = {site.split(":")[0] for site, _ in doc["sites"]["host-syncs"]}
    assert "vllm/v1/sample/rejection_sampler.py" in files
    assert "vllm/v1/worker/cpu_model_runner.py" not in files
    # greedy n-gram speculation is lossless, and the census changes nothing: each request's tokens so far are the
    # start of what plain greedy generation gives
    request: TokenizeRequest = {
        "task": "tokenize",
        "model": str(model),
        "prompts": list(vllm_census.SPEC_PROMPTS),
    }
    prompts = get_adapter("vllm").run(stock, request)["ids"]
    ids = doc["detail"]["tokens"]
    plain = greedy(stock, model, prompts, max(len(t) for t in ids), tmp_path)
    assert [p[: len(t)] for p, t in zip(plain, ids, strict=True)] == ids
