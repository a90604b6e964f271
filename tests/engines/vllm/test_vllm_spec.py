"""Speculative decoding in the real vLLM V1 engine of the CPU build, stock arm, through the check worker's spec task
(long: one worker process starts five engines, ~1.5-2 minutes on the 2-core machine, and the MTP test another two).

At temperature 0 every proposer must reproduce serial greedy token for token: draft models (the target as its own
draft, a never-right copy, the random drafter), an EAGLE head, vLLM's n-gram proposer and, on the one tiny shape the CPU
MLA kernel compiles for, MTP. vLLM's per-request counters must add up to its aggregate (Prometheus) ones and agree
with the tokens each request produced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from overlay.check import models as tinymodels
from overlay.check.envs import Arm, Arms
from overlay.check.inputs import never_right_draft
from overlay.check.measures import spec_summary
from overlay.engines import get_adapter
from overlay.schemas.documents import GreedyRequest, SpecRequest

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.long
PROMPTS = [[0, 11, 12, 13, 14, 15, 11, 12, 13], [0, 200, 201, 17, 200, 201], [0, 5, 6, 7, 8]]
K = 3
MAX_TOKENS = (
    160  # the random target falls into a repeating cycle after some tens of tokens: n-gram then drafts
)


def _load(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def _copy_config(src: Path, out: Path, **changes: Any) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("model.safetensors"):
            shutil.copy2(f, out / f.name)
    config: dict[str, Any] = {**json.loads((src / "config.json").read_text()), **changes}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return config


def eagle_head(target: Path, out: Path) -> Path:
    """An EAGLE-1 head for a llama target (EagleLlamaForCausalLM, one layer): the target's layer 0 and embedding,
    fc = [0 | I] so the layer reads the target's hidden state. Untrained: it runs the EAGLE path, it is rarely right."""
    from safetensors.numpy import save_file

    config = _copy_config(target, out, architectures=["EagleLlamaForCausalLM"], num_hidden_layers=1)
    h = int(config["hidden_size"])
    src = _load(target)
    head = {
        k.removeprefix("model."): v
        for k, v in src.items()
        if k.startswith("model.layers.0.") and "input_layernorm" not in k
    }
    head["fc.weight"] = np.concatenate([np.zeros((h, h), np.float32), np.eye(h, dtype=np.float32)], axis=1)
    head["embed_tokens.weight"] = src["model.embed_tokens.weight"]
    save_file(head, str(out / "model.safetensors"))
    return out


def mla_576(model: Path, out: Path) -> Path:
    """deepseek_v3-random with the latent shape vLLM's CPU MLA kernel compiles for (kv_lora_rank 512 +
    qk_rope_head_dim 64 = 576; the tiny model's 32 + 8 is refused); the reshaped tensors drawn again (seed 0)."""
    from safetensors.numpy import save_file

    config = _copy_config(model, out, kv_lora_rank=512, qk_rope_head_dim=64)
    heads, hidden, q_rank = config["num_attention_heads"], config["hidden_size"], config["q_lora_rank"]
    nope, v = config["qk_nope_head_dim"], config["v_head_dim"]
    shapes = {
        "kv_a_proj_with_mqa.weight": (512 + 64, hidden),
        "kv_b_proj.weight": (heads * (nope + v), 512),
        "q_b_proj.weight": (heads * (nope + 64), q_rank),
    }
    rng = np.random.default_rng(0)
    tensors = _load(model)
    for name in tensors:
        if name.endswith("kv_a_layernorm.weight"):
            tensors[name] = np.ones(512, np.float32)
        for suffix, shape in shapes.items():
            if name.endswith(suffix):
                tensors[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def _spec(arm: Arm, model: Path, drafts: dict[str, str], prompts: list[list[int]], n: int) -> dict[str, Any]:
    req: SpecRequest = {
        "task": "spec",
        "model": str(model),
        "drafts": drafts,
        "prompts": prompts,
        "k": K,
        "max_tokens": n,
    }
    return get_adapter("vllm").run(arm, req)


def _greedy(arm: Arm, model: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    req: GreedyRequest = {
        "task": "greedy",
        "model": str(model),
        "prompts": prompts,
        "max_tokens": n,
        "out": "",
    }
    outputs: list[list[int]] = get_adapter("vllm").run(arm, req)["outputs"]
    return outputs


@pytest.fixture(scope="module")
def runs(arms: Arms, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[list[int]]]:
    target = tinymodels.build("llama-random", root=REPO)
    tmp = tmp_path_factory.mktemp("spec")
    drafts = {
        "self": str(target),
        "never": str(never_right_draft(target, tmp / "never")),
        "real": str(tinymodels.build("llama-draft-random", root=REPO)),
        "eagle": "eagle:" + str(eagle_head(target, tmp / "eagle")),
        "ngram": "ngram",
    }
    spec = _spec(arms.stock, target, drafts, PROMPTS, MAX_TOKENS)["drafts"]
    return spec, _greedy(arms.stock, target, PROMPTS, MAX_TOKENS)


def test_every_proposer_reproduces_serial_greedy(runs: tuple[dict[str, Any], list[list[int]]]) -> None:
    spec, greedy = runs
    assert [len(g) for g in greedy] == [MAX_TOKENS] * len(PROMPTS)
    assert {label: run["method"] for label, run in spec.items()} == {
        "self": "draft_model",
        "never": "draft_model",
        "real": "draft_model",
        "eagle": "eagle",
        "ngram": "ngram",
    }
    for label, run in spec.items():
        assert [r["tokens"] for r in run["results"]] == greedy, label


def test_vllm_counters_add_up_and_match_the_tokens(runs: tuple[dict[str, Any], list[list[int]]]) -> None:
    spec, _ = runs
    for label, run in spec.items():
        stats = [r["stats"] for r in run["results"]]
        assert all(s is not None for s in stats), label
        totals = run["engine_counters"]
        assert run["counters_consistent"], label
        assert totals["drafts"] == sum(s["cycles"] for s in stats) > 0, label
        assert totals["draft_tokens"] == sum(s["drafted"] for s in stats), label
        assert totals["accepted_tokens"] == sum(s["accepted"] for s in stats), label
        for r, s in zip(run["results"], stats):
            assert sum(s["histogram"]) == s["cycles"], label
            assert sum(j * c for j, c in enumerate(s["histogram"])) == s["accepted"] <= s["drafted"], label
            assert s["drafted"] <= s["cycles"] * K, label
            # the first token comes from the prefill; each verify step emits its accepted drafts and one target
            # token, and the last step's may run past max_tokens
            emitted = 1 + s["cycles"] + s["accepted"]
            if run["method"] == "ngram":  # steps without a match draft nothing and are no verify step
                assert emitted <= len(r["tokens"]) + K, label
            else:  # a draft model or head drafts k at every step
                assert s["drafted"] == s["cycles"] * K, label
                assert 0 <= emitted - len(r["tokens"]) <= K, label


def test_self_draft_is_accepted_and_never_right_is_rejected(
    runs: tuple[dict[str, Any], list[list[int]]],
) -> None:
    spec, _ = runs
    self_draft = spec_summary(spec["self"], K)
    assert self_draft["counters"] == "engine"
    assert self_draft["acceptance_rate"] >= 0.95
    assert self_draft["acceptance_length"] > K  # up to K + 1 at full acceptance
    never = spec_summary(spec["never"], K)
    assert never["accepted"] == 0 and never["drafted"] > 0
    assert never["acceptance_length"] == 1.0


def test_ngram_drafts_from_the_context(runs: tuple[dict[str, Any], list[list[int]]]) -> None:
    spec, _ = runs
    ngram = spec_summary(spec["ngram"], K)
    assert ngram["drafted"] > 0 and ngram["accepted"] > 0
    assert 0.0 < ngram["acceptance_rate"] <= 1.0


def test_mtp_runs_on_the_cpu_mla_shape(arms: Arms, tmp_path: Path) -> None:
    model = mla_576(tinymodels.build("deepseek_v3-random", root=REPO), tmp_path / "ds576")
    prompts, n = PROMPTS[:2], 16
    run = _spec(arms.stock, model, {"mtp": "mtp"}, prompts, n)["drafts"]["mtp"]
    assert run["method"] == "mtp" and run["counters_consistent"]
    assert run["engine_counters"]["draft_tokens"] > 0  # the MTP layer drafted (random: it is not accepted)
    assert [r["tokens"] for r in run["results"]] == _greedy(arms.stock, model, prompts, n)
