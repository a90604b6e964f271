"""The vLLM census's pure parts, default suite: its scenarios as the trailers' vocabulary knows them, the adapter's
list, and how workers/vllm_census.py sorts engine steps into scenarios (from a SchedulerOutput's fields; no vLLM)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from overlay.core.mechanism import SCENARIOS, parse_mechanism, scenarios
from overlay.engines import get_adapter
from overlay.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "src" / "overlay" / "engines" / "workers"))

import vllm_census  # noqa: E402  (a worker script's module, from its folder)


def test_the_vllm_scenarios_are_the_census_vocabulary() -> None:
    assert {
        "decode-step",
        "decode-step-sampled",
        "decode-step-top-p",
        "decode-step-penalties",
        "spec-verify-step-sampled",
        "cold-start",
    } <= set(scenarios("vllm"))
    # the sampled scenarios count decode steps (or n-gram verify steps), with requests that take the sampler's top-k /
    # top-p path (or the rejection sampler's random path)
    kinds = dict(vllm_census.STEP_KIND)
    assert kinds.pop("spec-verify-step-sampled") == "spec-verify-step"
    assert set(kinds.values()) == {"decode-step"}
    assert set(vllm_census.SAMPLED) == set(vllm_census.STEP_KIND) | {"spec-verify-step-sampled"}
    assert vllm_census.SAMPLED["spec-verify-step-sampled"] == vllm_census.SAMPLED["decode-step-sampled"]
    assert set(vllm_census.SAMPLED["decode-step-sampled"]) == {"top_k", "top_p", "temperature"}
    assert set(vllm_census.SAMPLED["decode-step-top-p"]) == {"top_p", "temperature"}  # top-p alone
    # the penalties path without top-k / top-p (whose sort would set the step's peak memory)
    assert set(vllm_census.SAMPLED["decode-step-penalties"]) == {
        "temperature",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
    }
    assert (
        parse_mechanism("sort-elements decreases in decode-step-sampled", engine="vllm").metric
        == "sort-elements"
    )
    assert all(SCENARIOS["vllm"].values())
    assert "default process layout" in SCENARIOS["vllm"]["cold-start"]
    assert (
        parse_mechanism("host-syncs decreases in spec-verify-step", engine="vllm").scenario
        == "spec-verify-step"
    )
    with pytest.raises(ConfigError, match="vllm has no scenario 'draft-round'"):
        parse_mechanism("host-syncs decreases in draft-round", engine="vllm")


def test_the_adapter_and_the_worker_run_the_registered_scenarios() -> None:
    assert get_adapter("vllm").census_scenarios() == scenarios("vllm")
    assert scenarios("vllm") == vllm_census.SCENARIOS


def _out(tokens: dict[str, int], spec: dict[str, list[int]] | None = None) -> SimpleNamespace:
    return SimpleNamespace(num_scheduled_tokens=tokens, scheduled_spec_decode_tokens=spec or {})


def test_steps_are_sorted_by_what_the_scheduler_scheduled() -> None:
    batch = {f"r{i}": 1 for i in range(vllm_census.BATCH)}
    decoding = dict.fromkeys(batch, False)
    assert vllm_census._kind(_out(batch), decoding) == "decode-step"
    assert vllm_census._kind(_out({"r0": 1}), {"r0": False}) == "decode-partial"
    drafts = _out({**batch, "r0": 1 + vllm_census.SPEC_K}, {"r0": [5] * vllm_census.SPEC_K})
    assert vllm_census._kind(drafts, decoding) == "spec-verify-step"
    # a full chunk of one prompt is a prefill chunk; a short last chunk, or prompts of several requests, are not
    assert vllm_census._kind(_out({"p": vllm_census.CHUNK}), {"p": True}) == "prefill-chunk"
    assert vllm_census._kind(_out({"p": vllm_census.CHUNK // 2}), {"p": True}) == "prefill"
    assert vllm_census._kind(_out({"p": 10, "q": 10}), {"p": True, "q": True}) == "prefill"
    assert vllm_census._kind(_out({}), {}) is None


def test_each_workload_reaches_its_steps() -> None:
    prompts, max_tokens = vllm_census._workload("prefill-chunk", 4, "")
    assert len(prompts) == 1 and len(prompts[0]) // vllm_census.CHUNK == vllm_census.WARMUP + 4
    prompts, max_tokens = vllm_census._workload("decode-step", 4, "")
    assert len(prompts) == vllm_census.BATCH and max_tokens > vllm_census.WARMUP + 4


def test_unknown_scenarios_and_options_are_refused_before_an_engine_starts() -> None:
    with pytest.raises(SystemExit, match="unknown scenario 'draft-round'"):
        vllm_census.task_census({"task": "census", "model": "m", "scenario": "draft-round", "steps": 1})
    with pytest.raises(SystemExit, match="CLI options"):
        vllm_census.task_census(
            {"task": "census", "model": "m", "scenario": "decode-step", "steps": 1, "options": {"--x": None}}
        )


def _copies() -> list[object]:
    # what tqdm, networkx and platform do at import: read every variable, naming none
    return [dict(os.environ), [v for k, v in os.environ.items() if k.startswith("VLLM_")], os.environ.copy()]


def _env_with_choices(name: str) -> Callable[[], str | None]:
    return lambda: os.getenv(name)  # vLLM's envs helpers read a name they were given, from a closure


def test_a_switch_counts_as_read_when_the_engine_names_it_not_when_it_copies_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recording = vllm_census._RecordingEnviron
    monkeypatch.setattr(recording, "read", set())
    monkeypatch.setenv("VLLM_OVL_COPIED", "1")
    monkeypatch.setenv("VLLM_OVL_BY_NAME", "1")
    monkeypatch.setenv("VLLM_OVL_HELPER", "1")
    monkeypatch.setenv("VLLM_OVL_IN", "1")
    os.environ.__class__ = recording
    try:
        assert all(_copies())
        assert os.environ.get("VLLM_OVL_BY_NAME") == "1"
        assert _env_with_choices("VLLM_OVL_HELPER")() == "1"
        assert "VLLM_OVL_IN" in os.environ
    finally:
        os.environ.__class__ = os._Environ
    assert recording.read == {"VLLM_OVL_BY_NAME", "VLLM_OVL_HELPER", "VLLM_OVL_IN"}
