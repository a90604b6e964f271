"""The vLLM spec task's pure parts, default suite (no vLLM): the speculative_config each draft becomes, how vLLM's
per-request and aggregate counters are read and cross-checked, and the check's speculative step with the adapter's
n-gram proposer added to the self, never-right and real drafts (a stand-in adapter answers as the worker does)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from overlay.check import models as tinymodels
from overlay.check.adapter import Models
from overlay.check.envs import Arm
from overlay.check.gates import gates_for
from overlay.check.options import CheckOptions
from overlay.check.steps import spec_protocol
from overlay.core.manifest import load_engine
from overlay.engines import get_adapter
from overlay.engines.vllm import VllmAdapter
from overlay.progress import ListReporter
from overlay.schemas.documents import WorkerRequest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "src" / "overlay" / "engines" / "workers"))

import vllm_worker  # noqa: E402  (a worker script's module, from its folder)


def test_each_draft_becomes_vllms_own_speculative_config() -> None:
    assert vllm_worker.speculative_config("/m/draft", 3) == {
        "method": "draft_model",
        "model": "/m/draft",
        "num_speculative_tokens": 3,
    }
    assert vllm_worker.speculative_config("ngram", 4) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    }
    assert vllm_worker.speculative_config("mtp", 2) == {"method": "mtp", "num_speculative_tokens": 2}
    assert vllm_worker.speculative_config("eagle:/m/head", 3)["model"] == "/m/head"
    assert vllm_worker.speculative_config("eagle:/m/head", 3)["method"] == "eagle"


def _metrics(histogram: list[int], drafted: int) -> SimpleNamespace:
    steps = sum(histogram)
    accepted = sum(j * c for j, c in enumerate(histogram))
    d = {
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_steps": steps,
        "acceptance_histogram": histogram,
    }
    return SimpleNamespace(to_dict=lambda: d)


def test_request_counters_and_their_sum_against_the_engines() -> None:
    a = vllm_worker.request_stats(_metrics([1, 0, 2, 3], drafted=18))
    assert a == {"accepted": 13, "drafted": 18, "cycles": 6, "histogram": [1, 0, 2, 3]}
    results: list[dict[str, Any]] = [
        {"stats": a},
        {"stats": None},
    ]  # a request without counters had no verify step
    totals = {"drafts": 6, "draft_tokens": 18, "accepted_tokens": 13}
    assert vllm_worker.counters_consistent(results, totals)
    assert not vllm_worker.counters_consistent(results, {**totals, "accepted_tokens": 12})
    assert not vllm_worker.counters_consistent(results, {**totals, "drafts": 7})


def test_the_aggregate_counters_are_read_from_vllms_metrics() -> None:
    snapshot = [
        SimpleNamespace(name="vllm:spec_decode_num_drafts", value=6),
        SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=18),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=13),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[6, 4, 3]),
        SimpleNamespace(name="vllm:num_requests_running", value=1),
    ]
    llm = SimpleNamespace(get_metrics=lambda: snapshot)
    assert vllm_worker.engine_counters(llm) == {"drafts": 6, "draft_tokens": 18, "accepted_tokens": 13}


class _Worker(VllmAdapter):
    """Answers the spec task as vllm_worker.py does: every draft reproduces greedy; the self draft is always
    accepted, the never-right one never, the others half the time."""

    def __init__(self, greedy: list[list[int]]) -> None:
        self.greedy = greedy
        self.requests: list[dict[str, Any]] = []

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        self.requests.append(dict(request))
        assert request["task"] == "spec"
        k = request["k"]
        rate = {"self": 1.0, "never": 0.0}
        drafts = {}
        for label in request["drafts"]:
            cycles = 10
            stats = {
                "accepted": int(rate.get(label, 0.5) * cycles * k),
                "drafted": cycles * k,
                "cycles": cycles,
            }
            drafts[label] = {
                "results": [{"tokens": g, "from_draft": [], "stats": stats} for g in self.greedy]
            }
        return {"drafts": drafts}


def test_the_checks_speculative_step_runs_the_ngram_proposer_too(tmp_path: Path) -> None:
    assert "spec" in get_adapter("vllm").tasks()
    target = tinymodels.build("llama-random", root=REPO)
    greedy = [[5, 6, 7], [8, 9, 10]]
    worker = _Worker(greedy)
    stock, patched = (
        Arm(name=name, engine="vllm", venv=tmp_path, wheel=tmp_path / "w.whl", version="0")
        for name in ("stock", "patched")
    )
    runs: dict[str, dict[str, Any]] = {arm.name: {"outputs": greedy} for arm in (stock, patched)}
    models = Models(target=target, draft=target)
    reporter = ListReporter()
    spec = spec_protocol(
        worker,
        stock,
        patched,
        models,
        [[0, 1], [0, 2]],
        runs,
        CheckOptions(engine="vllm"),
        tmp_path,
        reporter,
    )
    assert list(worker.requests[0]["drafts"]) == ["self", "never", "real", "ngram"]
    assert "speculative: self, never, real, ngram drafts, k=3, stock arm" in reporter.lines[0]
    assert worker.requests[0]["drafts"]["ngram"] == "ngram"
    assert spec["ngram"]["patched"]["counters"] == "engine"
    assert spec["ngram"]["patched"]["acceptance_rate"] == 0.5
    assert spec["ngram"]["patched_identical_to_serial"] and spec["ngram"]["stock_identical_to_serial"]
    assert spec["self"]["patched"]["acceptance_length"] == 4.0
    gates = gates_for(
        "lossless", greedy=None, logits=None, spec=spec, manifest=load_engine(REPO, "vllm"), who="series"
    )
    assert [(g["gate"], g["passed"]) for g in gates] == [
        ("self-draft acceptance >= 0.98", True),
        ("never-right draft: output identical to serial", True),
    ]
