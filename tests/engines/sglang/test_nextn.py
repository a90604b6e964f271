"""MTP on a real MTP architecture: SGLang's NEXTN path (DeepseekV3ForCausalLMNextN) on the CPU engine.

A tiny DeepSeek-V3 checkpoint (MLA + MoE, 2 layers, one NextN layer at ``model.layers.2``; nextn_support.py) is
served by stock and patched SGLang 0.5.23 with ``--speculative-algorithm NEXTN`` (the draft is the checkpoint's own
NextN layer, which SGLang loads as ``DeepseekV3ForCausalLMNextN`` sharing the target's embedding and lm_head) and
without speculation, on the ``intel_amx`` attention backend served by the stand-in sgl_kernel. The harness plugin
``support/testbackends/sglang/plugins`` is on both arms' path (the CPU engine cannot start NEXTN on DeepSeek
without it: see its docstring) and reports what the draft model is.

Each arm runs one ``run_engine.py`` process: stock "plain" and "nextn"; patched "nextn_off" (no flag) and "nextn"
(0009 ``SGLANG_OPT_CPU_SAMPLING_VERIFY`` + 0010 ``SGLANG_OPT_SPEC_ACCEPT_STATS``). Every speculative run serves the
same 8 requests in one batch: 4 prompts greedy (workload "code") and the same 4 at temperature 0.7, top-k 20,
top-p 0.9 (workload "chat"). Four engine starts: minutes on 2 cores, so ``long``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from nextn_support import NUM_HIDDEN_LAYERS, build_nextn_checkpoint, nextn_config_and_tensors
from sglang_support import RUN_ENGINE, regime_stats, tokens

from overlay.check.envs import Arm, Arms

pytestmark = pytest.mark.long

PLUGINS = Path(__file__).resolve().parents[3] / "support" / "testbackends" / "sglang" / "plugins"
PROMPTS = [[0, 5, 9, 17, 33, 40, 41], [0, 7, 7, 100, 200, 300], [0, 3, 99, 250, 7], [0, 480, 2, 66, 12]]
MAX_NEW_TOKENS = 32
SPEC = {"algorithm": "NEXTN", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}
GREEDY = {"temperature": 0.0, "custom_params": {"workload": "code"}}
SAMPLED = {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "custom_params": {"workload": "chat"}}
MIXED = [GREEDY] * len(PROMPTS) + [SAMPLED] * len(PROMPTS)
FLAGS = {"SGLANG_OPT_CPU_SAMPLING_VERIFY": "1", "SGLANG_OPT_SPEC_ACCEPT_STATS": "1"}
N = len(PROMPTS)


def _payload(model: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": str(model), "prompts": PROMPTS + PROMPTS, "max_new_tokens": MAX_NEW_TOKENS, "runs": runs}


def _run(arm: Arm, payload: dict[str, Any], report: Path) -> dict[str, Any]:
    path = os.pathsep.join(p for p in (arm.env.get("PYTHONPATH", ""), str(PLUGINS)) if p)
    out: dict[str, Any] = arm.run_json(
        RUN_ENGINE,
        payload,
        timeout=2400,
        extra_env={"PYTHONPATH": path, "OVERLAY_SGLANG_DRAFT_REPORT": str(report)},
    )["runs"]
    out["draft"] = json.loads(report.read_text())
    return out


@pytest.fixture(scope="module")
def nextn(
    arms: Arms, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(model, stock runs, patched runs)."""
    tmp = tmp_path_factory.mktemp("nextn")
    model = build_nextn_checkpoint(tmp / "deepseek_v3-nextn")
    spec = {**SPEC, "draft_model": str(model)}
    stock = _run(
        arms.stock,
        _payload(
            model,
            [
                {"name": "plain", "engine_args": {"attention_backend": "intel_amx"}, "sampling": MIXED},
                {"name": "nextn", "spec": spec, "sampling": MIXED, "env": FLAGS, "server_info": True},
            ],
        ),
        tmp / "stock-draft.json",
    )
    patched = _run(
        arms.patched,
        _payload(
            model,
            [
                {"name": "nextn_off", "spec": spec, "sampling": MIXED, "server_info": True},
                {"name": "nextn", "spec": spec, "sampling": MIXED, "env": FLAGS, "server_info": True},
            ],
        ),
        tmp / "patched-draft.json",
    )
    return model, stock, patched


def _hist_sum(outputs: list[dict[str, Any]]) -> list[int]:
    hists = [o["meta_info"]["spec_correct_drafts_histogram"] for o in outputs]
    total = [0] * max(len(h) for h in hists)
    for h in hists:
        for i, n in enumerate(h):
            total[i] += n
    return total


def _accept_length(outputs: list[dict[str, Any]]) -> float:
    verifies: int = sum(o["meta_info"]["spec_verify_ct"] for o in outputs)
    accepted = sum(i * n for i, n in enumerate(_hist_sum(outputs)))
    return (verifies + accepted) / verifies


def test_draft_is_the_checkpoints_nextn_layer(nextn: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    """SGLang serves the draft as DeepseekV3ForCausalLMNextN, with the checkpoint's own NextN layer weights
    (``model.layers.2.eh_proj``) and the target's embedding and lm_head, and speculation really ran."""
    _, stock, patched = nextn
    _, tensors = nextn_config_and_tensors()
    want = float(tensors[f"model.layers.{NUM_HIDDEN_LAYERS}.eh_proj.weight"].astype("float64").sum())
    for runs in (stock, patched):
        draft = runs["draft"]
        assert draft["class"] == "DeepseekV3ForCausalLMNextN"
        assert draft["decoder"] == "DeepseekV2DecoderLayer"
        assert draft["eh_proj_sum"] == pytest.approx(want, rel=1e-6)
        assert draft["shares_embed"] and draft["shares_head"]
        state = runs["nextn"]["internal_states"][0]
        assert state["speculative_algorithm"] == "EAGLE"  # NEXTN is resolved to EAGLE
        assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in runs["nextn"]["outputs"])


def test_nextn_greedy_equals_plain_greedy(nextn: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    """Greedy NEXTN decodes exactly as plain greedy on the same engine, on both wheels, also when the greedy requests
    share the batch with sampled ones (with 0009 on, that batch takes the sampling verify); with the flags off the
    patched wheel reproduces stock token for token, sampled requests included (same seed)."""
    _, stock, patched = nextn
    plain = tokens(stock["plain"])[:N]
    assert all(len(t) == MAX_NEW_TOKENS for t in plain)
    assert tokens(stock["nextn"])[:N] == plain
    assert tokens(patched["nextn"])[:N] == plain
    assert tokens(patched["nextn_off"]) == tokens(stock["nextn"])


def test_nextn_acceptance_statistics(
    nextn: tuple[Path, dict[str, Any], dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """The real head is accepted part of the time (greedy: accept length strictly between 1 and 4); greedy
    acceptance is identical on both wheels and flag settings (0009 and 0010 change no greedy decision); 0010's
    per-regime histograms are the sums of the per-request histograms of the same requests."""
    _, stock, patched = nextn
    greedy = {
        name: runs[key]["outputs"][:N]
        for name, runs, key in (
            ("stock", stock, "nextn"),
            ("off", patched, "nextn_off"),
            ("on", patched, "nextn"),
        )
    }
    hist = {
        name: [o["meta_info"]["spec_correct_drafts_histogram"] for o in outs] for name, outs in greedy.items()
    }
    assert hist["on"] == hist["stock"] and hist["off"] == hist["stock"]
    length = _accept_length(greedy["stock"])
    assert 1.0 < length < 4.0
    # 0009: the sampled rows are verified by sampling; stock's CPU verify samples only their first token and then
    # follows the greedy chain, and with the flag off the patched wheel does the same (asserted above)
    assert tokens(patched["nextn"])[N:] != tokens(stock["nextn"])[N:]
    assert regime_stats(stock["nextn"]) == [], "stock must not publish the statistics"
    assert regime_stats(patched["nextn_off"]) == [], "flag off: no statistics"
    rows = {(r["temperature_bucket"], r["workload"]): r for r in regime_stats(patched["nextn"])}
    assert set(rows) == {("greedy", "code"), ("(0.5,0.9]", "chat")}
    outs = patched["nextn"]["outputs"]
    assert rows[("greedy", "code")]["correct_drafts_histogram"] == _hist_sum(outs[:N])
    assert rows[("(0.5,0.9]", "chat")]["correct_drafts_histogram"] == _hist_sum(outs[N:])
    assert rows[("greedy", "code")]["verify_ct"] == sum(o["meta_info"]["spec_verify_ct"] for o in outs[:N])
    summary = {
        "stock": {
            "T=0": {"accept_length": round(length, 3), "histogram": _hist_sum(greedy["stock"])},
            "T=0.7 (stock CPU verify is greedy)": {
                "accept_length": round(_accept_length(stock["nextn"]["outputs"][N:]), 3),
                "histogram": _hist_sum(stock["nextn"]["outputs"][N:]),
            },
        },
        "patched 0009+0010": {
            f"{t}/{w}": {k: r[k] for k in sorted(r) if k not in ("temperature_bucket", "workload")}
            for (t, w), r in rows.items()
        },
    }
    with capsys.disabled():
        print("\nsglang NEXTN acceptance (tiny DeepSeek-V3, 3 steps, topk 1):", json.dumps(summary))
