"""The check's CLI options reach the mlx-lm worker's generating tasks (workers/mlx_lm_worker.py, mlx_lm_options.py):
greedy, speculative, speed and cold apply the options their mlx-lm function takes, say which, and the adapter's
``option_reach`` tells the check which CLI-flag patches its comparisons exercise."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arms
from overlay.check.flags import choose
from overlay.check.models import build
from overlay.core.manifest import load_engine
from overlay.core.series import load_engine_series
from overlay.engines.mlx_lm import MlxLmAdapter

ADAPTER = MlxLmAdapter()
PROMPT = [1, *range(40, 52)]


@pytest.fixture(scope="module")
def model(repo_root: Path) -> str:
    return str(build("llama-random", root=repo_root))


def _run(arm: Any, request: dict[str, Any]) -> dict[str, Any]:
    return ADAPTER.run(arm, request)  # type: ignore[arg-type]


def test_greedy_speed_and_cold_apply_the_options_they_take(arms: Arms, model: str) -> None:
    """--kv-bits 4 --quantized-kv-start 0 (stock generate_step options) quantize the KV cache from the first token: the
    step log-probabilities change (the random model's tokens barely depend on attention), so the options really
    reached generate_step; an option it does not take is reported."""
    base = {"task": "greedy", "model": model, "prompts": [PROMPT], "max_tokens": 12}
    plain = _run(arms.stock, base)
    kv4 = {"--kv-bits": "4", "--quantized-kv-start": "0"}
    windowed = _run(arms.stock, {**base, "options": {**kv4, "--no-such-option": None}})
    assert windowed["options"]["applied"] == kv4
    assert "--no-such-option" in windowed["options"]["unused"]
    assert plain["options"] == {"applied": {}, "unused": {}}
    moved = max(abs(a - b) for a, b in zip(windowed["margins"][0], plain["margins"][0], strict=True))
    assert moved > 1e-4, moved
    speed = _run(
        arms.stock,
        {
            "task": "speed",
            "model": model,
            "prompt": PROMPT,
            "decode_tokens": 4,
            "inner_reps": 1,
            "options": kv4,
        },
    )
    assert speed["options"]["applied"] == kv4 and speed["decode_tok_s"] > 0


def test_spec_applies_the_series_draft_options_and_keeps_its_own(arms: Arms, model: str) -> None:
    opts = {"--draft-max-kv-size": "64", "--adaptive-draft": None, "--draft-kind": "mtp", "--keep-mtp": None}
    res = _run(
        arms.patched,
        {
            "task": "spec",
            "model": model,
            "drafts": {"self": model},
            "prompts": [PROMPT],
            "k": 2,
            "max_tokens": 8,
            "options": opts,
        },
    )
    assert res["options"]["applied"] == {"--draft-max-kv-size": "64", "--adaptive-draft": None}
    assert "sets draft_kind itself" in res["options"]["unused"]["--draft-kind"]
    assert "takes no keep_mtp" in res["options"]["unused"]["--keep-mtp"]
    assert len(res["drafts"]["self"]["results"][0]["tokens"]) == 8


def test_option_reach_is_read_from_the_arm(arms: Arms) -> None:
    """The patched wheel's speculative path takes the series' draft options, the stock one does not: the check's
    gate class counts the CLI-flag patches from what the arm itself reports."""
    opts: dict[str, str | None] = {"--draft-max-kv-size": "64", "--adaptive-draft": None, "--keep-mtp": None}
    assert ADAPTER.option_reach(arms.patched, opts) == {"--draft-max-kv-size", "--adaptive-draft"}
    assert ADAPTER.option_reach(arms.stock, opts) == set()


def test_reached_options_bring_their_patches_into_the_gate_class(repo_root: Path) -> None:
    """With the options the patched arm reports as reached, the CLI-flag patches that use them count as exercised;
    the others (a convert option, a draft kind the comparisons do not run) stay listed as not exercised."""
    series = load_engine_series(repo_root, load_engine(repo_root, "mlx-lm")).patches
    chosen = choose(series, "all", engine="mlx-lm")
    before = {p.name[:4] for p in chosen.active} - {p.name[:4] for p in chosen.exercised}
    after_choice = dataclasses.replace(chosen, reached=frozenset({"--draft-max-kv-size", "--adaptive-draft"}))
    after = {p.name[:4] for p in after_choice.active} - {p.name[:4] for p in after_choice.exercised}
    assert {"0019", "0021"} <= before and not {"0019", "0021"} & after
    assert {"0014", "0022", "0027"} <= after
    listed = {n["patch"][:4]: n for n in after_choice.report()["not_exercised"]}
    assert set(listed) == after and listed["0014"]["flags"] == ["--keep-mtp"]
