"""`overlay check sglang --draft-kind deepseek_v3-nextn-random`'s "mtp" run, on the real engine: the adapter's spec task
with only that label, in the stock and the patched arm (the rest of the check is the usual one, on llama-target).

The worker serves the bundled NextN checkpoint with ``--speculative-algorithm NEXTN`` (its own NextN layer drafts) and
a plain engine on it for the serial baseline; the harness plugin is on the arm's path for the NEXTN engine only. Ten
of the check's built-in prompts (two per category), 32 tokens, k = 3: four engine starts, so ``long``. Prints the
figures docs/engines/sglang.md quotes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nextn_support import KIND, NUM_HIDDEN_LAYERS, nextn_config_and_tensors

from overlay.check.envs import Arms
from overlay.check.measures import spec_summary
from overlay.check.models import all_prompts, build
from overlay.check.models.tokenizer import load_tokenizer
from overlay.engines.sglang import SglangAdapter

pytestmark = pytest.mark.long

K = 3
MAX_TOKENS = 32
PER_CATEGORY = 2


def _prompt_ids(model: Path) -> list[list[int]]:
    tok = load_tokenizer(model)
    seen: dict[str, int] = {}
    ids = []
    for category, text in all_prompts():
        if seen.get(category, 0) < PER_CATEGORY:
            seen[category] = seen.get(category, 0) + 1
            ids.append(tok.encode(text).ids)
    return ids


@pytest.fixture(scope="module")
def mtp(arms: Arms, repo_root: Path) -> tuple[list[list[int]], dict[str, Any]]:
    model = build(KIND, root=repo_root)
    prompts = _prompt_ids(model)
    adapter = SglangAdapter()
    runs = {
        arm.name: adapter.run(
            arm,
            {
                "task": "spec",
                "model": str(model),  # unused by the "mtp" label (it serves its own checkpoint)
                "drafts": {"mtp": str(model)},
                "prompts": prompts,
                "k": K,
                "max_tokens": MAX_TOKENS,
            },
        )["drafts"]["mtp"]
        for arm in (arms.stock, arms.patched)
    }
    return prompts, runs


def test_mtp_run_is_nextn_on_the_real_head(mtp: tuple[list[list[int]], dict[str, Any]]) -> None:
    """Both arms: the draft SGLang served is the checkpoint's NextN layer (DeepseekV3ForCausalLMNextN with the
    checkpoint's eh_proj, sharing the target's embedding and lm_head), and every request was verified."""
    _, runs = mtp
    _, tensors = nextn_config_and_tensors()
    want = float(tensors[f"model.layers.{NUM_HIDDEN_LAYERS}.eh_proj.weight"].astype("float64").sum())
    for run in runs.values():
        about = run["about"]
        assert about["algorithm"] == "NEXTN" and any("PYTHONPATH" in n for n in about["notes"])
        served = about["draft_served"]
        assert served["class"] == "DeepseekV3ForCausalLMNextN"
        assert served["eh_proj_sum"] == pytest.approx(want, rel=1e-6)
        assert served["shares_embed"] and served["shares_head"]
        assert all(r["stats"]["cycles"] > 0 for r in run["results"])


def test_mtp_greedy_is_serial_greedy_and_acceptance_is_stocks(
    mtp: tuple[list[list[int]], dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """At T=0 the NEXTN output equals the plain engine's on the same checkpoint, in both arms; the patched arm (flags
    off) accepts exactly what stock accepts; the real head is accepted part of the time (1 < AL < k + 1)."""
    prompts, runs = mtp
    for run in runs.values():
        assert [r["tokens"] for r in run["results"]] == run["serial"]
        assert all(len(t) == MAX_TOKENS for t in run["serial"])
    summary = {name: spec_summary(run, K) for name, run in runs.items()}
    assert summary["patched"] == summary["stock"]
    assert 1.0 < summary["stock"]["acceptance_length"] < K + 1
    hist = {name: [r["stats"]["histogram"] for r in run["results"]] for name, run in runs.items()}
    assert hist["patched"] == hist["stock"]
    with capsys.disabled():
        print(
            f"\nsglang check mtp ({len(prompts)} prompts x {MAX_TOKENS} tokens, k={K}):",
            json.dumps({"summary": summary, "histograms": hist}),
        )
