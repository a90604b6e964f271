"""The real vLLM V1 engine of the CPU build, stock vs patched arm, through the check worker (long: each engine start
is ~1-3 minutes on the 2-core machine). The tiny random llama (no mlx needed) is the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlay.check.envs import Arms
from overlay.engines import get_adapter

pytestmark = pytest.mark.long
PROMPTS = [[0, 11, 12, 13, 14, 15], [0, 200, 201, 17]]


def test_greedy_is_identical_stock_vs_patched(arms: Arms, model: Path, tmp_path: Path) -> None:
    adapter = get_adapter("vllm")
    assert adapter.unavailable(arms.stock) is None
    runs = {}
    for arm in (arms.stock, arms.patched):
        out = tmp_path / arm.name
        out.mkdir()
        runs[arm.name] = adapter.run(
            arm,
            {"task": "greedy", "model": str(model), "prompts": PROMPTS, "max_tokens": 12, "out": str(out)},
        )
    stock, patched = runs["stock"], runs["patched"]
    assert [len(o) for o in stock["outputs"]] == [12, 12]
    assert stock["outputs"] == patched["outputs"]
    assert all(m >= 0 for row in stock["margins"] for m in row)
    assert stock["engine_version"] == "0.32.0"


def test_teacher_forced_logprobs_cover_the_vocabulary(arms: Arms, model: Path, tmp_path: Path) -> None:
    import numpy as np

    adapter = get_adapter("vllm")
    seq = [0, *range(20, 60)]
    res = adapter.run(
        arms.stock,
        {"task": "logits", "model": str(model), "sequences": [seq], "vocab_size": 512, "out": str(tmp_path)},
    )
    dense = np.load(res["files"][0])
    assert dense.shape == (len(seq) - 1, 512)
    assert np.isfinite(dense).all()  # every token of the vocabulary has a log-probability at every position
    np.testing.assert_allclose(np.exp(dense).sum(axis=1), 1.0, atol=1e-4)


def test_cold_start_reports_ready_and_first_token(arms: Arms, model: Path) -> None:
    adapter = get_adapter("vllm")
    res = adapter.run(arms.stock, {"task": "cold", "model": str(model), "prompt": [0, 5, 6, 7]})
    assert res["t_start"] < res["t_ready"] <= res["t_first_token"]
