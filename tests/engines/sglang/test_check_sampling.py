"""The check's sampling-distribution test on SGLang's CPU engine path (overlay.check.sampling, workers/sample_sglang.py):
token frequencies at fixed positions, stock vs patched with the sampler flags on, chi-square per position."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlay.check import sampling
from overlay.check.envs import Arms
from overlay.check.models import build, stock_mlx_python

FLAGS = {"SGLANG_OPT_GUMBEL_TOPK_TOPP_SAMPLE": "1"}


def test_cli_options_are_refused_before_any_engine_starts() -> None:
    """The series' SGLang flags are environment variables: a CLI option would silently not reach the engine."""
    proc = subprocess.run(
        [sys.executable, str(sampling.SAMPLERS["sglang"])],
        input=json.dumps({"options": {"--x": None}}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "CLI options ['--x'] are not applied" in proc.stderr
    assert sampling.available("sglang")


@pytest.mark.long  # two CPU engines (1-3 minutes each on 2 shared cores)
def test_sampled_tokens_are_distributed_as_stock_s(arms: Arms, repo_root: Path) -> None:
    # llama-target (trained): its next-token distributions are peaked enough that 60 runs fill the chi-square cells;
    # the random llama's are near-flat over 512 tokens, every cell pooled, and only 2 of the 8 tests could say anything
    model = build("llama-target", root=repo_root, python=stock_mlx_python(repo_root))
    prompts = [[1, *range(40, 50)], [1, 300, 301, 302, 303, 304]]
    patched = arms.patched.with_env(FLAGS)
    seeds = list(range(1, 61))
    out = {
        arm.name: sampling.sample("sglang", arm, model, prompts, temperature=0.7, seeds=seeds, positions=4)
        for arm in (arms.stock, patched)
    }
    for tokens in out.values():
        assert [len(runs) for runs in tokens] == [60, 60]
        assert all(len(run) == 4 for runs in tokens for run in runs)
        assert len({tuple(run) for run in tokens[0]}) > 3  # independent draws, not one run repeated
    result = sampling.compare(
        out["stock"], out["patched"], categories=["a", "b"], temperature=0.7, positions=4
    )
    # 6 of the 8 (prompt, position) tests at least have two categories to compare (the trained model's first token
    # can be nearly certain); the random llama gave 2
    assert result["informative_tests"] >= 6 and result["equal"], result["worst"]
