"""The speculative generator's serial path does the work of ``generate_step`` per token (issue 16), counted.

Where drafting cannot pay (a never-right drafter) the adaptive generator drafts no cycle (test_spec_shadow.py): every
token comes from its serial path (``_serial``). Whether that path costs more per token than ``generate_step`` is
counted here, not timed (probes/spec_serial_census.py, patched arm only: stock has no adaptive drafting; the tiny
qwen3 target and its never-right drafter, greedy, 96 tokens):

- Evaluations, under the mlx census's hooks (mlx_census_hooks.Census): every token inside a serial run costs what a
  ``generate_step`` token costs, one ``mx.async_eval`` that queues the next target step before this token's one
  ``.item()`` (2 evaluations, 1 host sync), and no more primitives (the speculative path's one fewer is
  ``generate_step``'s ``logprobs.squeeze(0)``, evaluated there, a lazy ``slp[0]`` here). A controller that never
  drafts makes one run: only its last token comes without a next step queued. With the adaptive controller the only
  other events are at the ends of its serial runs: the drafter's catch-up (at most 3 drafter evaluations, its
  evidence read back once) and the last token of each run yielded with no next step queued.
- Python, under ``sys.setprofile``: the same model forward per token; at most 2 more Python calls (the ``_serial``
  generator, ``SpeculativeStats.record_serial``) and 4 more C calls (the controller's interval stamp, the evidence
  and token lists) than ``generate_step``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arms

PROBE = Path(__file__).parent / "probes" / "spec_serial_census.py"
MODES = ["serial", "never", "adaptive"]
# generate_step's order: queue the next step, then read this one
STEADY = [["async_eval", "target"], ["item", "target"]]


def _payload(repo_root: Path, models: dict[str, str], count: str) -> dict[str, Any]:
    return {
        "hooks": str(repo_root / "src" / "overlay" / "engines" / "workers"),
        "target": models["qwen3"],
        "draft": models["qwen3-random"],
        "max_tokens": 96,
        "k": 3,
        "modes": MODES,
        "count": count,
    }


@pytest.fixture(scope="module")
def evals(arms: Arms, models: dict[str, str], repo_root: Path) -> dict[str, Any]:
    modes: dict[str, Any] = arms.patched.run_json(PROBE, _payload(repo_root, models, "evals"))["modes"]
    return modes


@pytest.fixture(scope="module")
def calls(arms: Arms, models: dict[str, str], repo_root: Path) -> dict[str, Any]:
    modes: dict[str, Any] = arms.patched.run_json(PROBE, _payload(repo_root, models, "calls"))["modes"]
    return modes


def _shape(token: dict[str, Any]) -> list[list[str]]:
    return [e[:2] for e in token["events"]]


def _step_ops(token: dict[str, Any]) -> list[int]:
    return [e[2] for e in token["events"] if e[0] == "async_eval" and e[1] == "target"]


def test_serial_path_tokens_cost_what_generate_step_tokens_cost(evals: dict[str, Any]) -> None:
    serial = evals["serial"]["per_token"][1:]  # the first yield holds the prefill
    assert all(_shape(t) == STEADY for t in serial), [_shape(t) for t in serial if _shape(t) != STEADY]
    ops = max(_step_ops(t)[0] for t in serial)
    for mode in ("never", "adaptive"):
        run = evals[mode]
        assert run["tokens"] == evals["serial"]["tokens"], mode  # greedy: the serial tokens, byte for byte
        assert run["cycles"] == 0, mode
        steady = [t for t in run["per_token"][1:] if _shape(t) == STEADY]
        assert all(_step_ops(t)[0] <= ops for t in steady), (mode, ops, [_step_ops(t) for t in steady])
        assert sum(t["evals"] for t in steady) == 2 * len(steady), mode
        assert sum(t["syncs"] for t in steady) == len(steady), mode
    never = evals["never"]["per_token"][1:]
    assert [_shape(t) for t in never] == [STEADY] * (len(never) - 1) + [[["item", "target"]]]


def test_adaptive_serial_path_differs_only_at_run_ends(evals: dict[str, Any]) -> None:
    tokens = evals["adaptive"]["per_token"]
    catch_ups = [i for i, t in enumerate(tokens) if i > 0 and t["draft_evals"]]
    ends = [i for i, t in enumerate(tokens) if i > 0 and not t["pipelined"]]
    assert catch_ups, "no catch-up: the adaptive controller never asked for evidence"
    # The last token of a run comes without a next step queued; the catch-up follows it, and the next run starts by
    # queueing its first two steps (the first is read straight away).
    assert ends == [i - 1 for i in catch_ups] + [len(tokens) - 1], (ends, catch_ups)
    for i in catch_ups:
        t = tokens[i]
        assert t["draft_evals"] <= 3 and t["ops"]["draft"] > 0, t["events"]
        target = [e[:2] for e in t["events"] if e[1] == "target"]
        assert target == [["async_eval", "target"], *STEADY], t["events"]
    rest = [t for i, t in enumerate(tokens) if i > 0 and i not in catch_ups and i not in ends]
    assert all(_shape(t) == STEADY for t in rest)


def test_serial_path_python_work_per_token(calls: dict[str, Any]) -> None:
    def median(mode: str, prefix: str) -> float:
        per = [
            sum(v for k, v in t["calls"].items() if k.startswith(prefix))
            for t in calls[mode]["per_token"][1:]
        ]
        return float(statistics.median(per))

    def forward(mode: str) -> float:
        return float(
            statistics.median(t["calls"].get("py __call__", 0) for t in calls[mode]["per_token"][1:])
        )

    for mode in ("never", "adaptive"):
        assert forward(mode) == forward("serial"), mode
        for prefix, extra in (("py ", 2), ("c ", 4)):
            got, ref = median(mode, prefix), median("serial", prefix)
            assert got <= ref + extra, (mode, prefix, got, ref)
