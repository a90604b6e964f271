"""0009 and 0010: sampled speculative decoding on vLLM's CPU build. Long: three arms' function runs and four census
runs of the real engine, ~1 minute each on the 2-core machine.

0009 (always on): the rejection sampler expands each request's temperature, top-k and top-p to its draft positions
(``expand_batch_to_tokens``); on the CPU build stock's expand writes an int64 copy and leaves the float32 / int32 output
unwritten, so a sampled speculative step reads uninitialised memory (with a top-k the engine dies with "index ... is out
of bounds"). 0010 (``VLLM_OVL_RECOVER_AT_REJECTION=1``): a recovered token only at each request's first rejection, by
an inverse CDF over the residual's support, instead of vocabulary-wide exponential noise for every request.

- the expand itself, stock vs the series: the series gives each position its request's value (the greedy temperature 0
  replaced by 1), stock does not;
- the rejection sampler's output distribution (``apply_sampling_constraints`` + ``rejection_sample``, 20000 requests of
  two n-gram-style drafts at temperature 0.7, top-k 20, top-p 0.8 on a fixed 50-token distribution): with the flag off
  and on, the first output token is distributed as the target's filtered distribution (chi-square) and the two agree
  (homogeneity); the accepted lengths are the same request for request (the same uniform numbers decide); the second
  token after an accepted first draft is distributed as the second position's target;
- the census's ``spec-verify-step-sampled`` (the real engine on llama-target, n-gram drafts, seeded sampled
  requests): stock fails with
  the out-of-bounds error; the series runs with the flag off and on, every request to its full length; the flag draws
  a few random numbers a step where stock's path draws two vocabulary rows per request (``random-elements``), and its
  sites no longer include the recovered tokens' exponential noise.

Run against the stock wheel in the patched arm's place, the expand and the census tests fail (garbage, the crash) and
the flag is never read (the census gives every metric None).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import vllm_support

from overlay.check.envs import Arm, Arms
from overlay.check.stats import goodness_of_fit, homogeneity
from overlay.errors import ExternalCommandError

pytestmark = pytest.mark.long
FLAG = {"VLLM_OVL_RECOVER_AT_REJECTION": "1"}
SCENARIO = "spec-verify-step-sampled"
STEPS = 3
ALPHA = 1e-3

EXPAND = r"""
import json, torch
from vllm.platforms import current_platform
current_platform.register_triton_kernel_overrides()
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

cu = torch.tensor([3, 5, 6], dtype=torch.int32)  # 3, 2 and 1 draft positions
out = {}
for name, x, frm, to in (
    ("temperature", torch.tensor([0.7, 0.0, 1.3], dtype=torch.float32), 0, 1),
    ("top_k", torch.tensor([20, 5, 1], dtype=torch.int32), 0, 0),
    ("top_p", torch.tensor([0.8, 0.95, 1.0], dtype=torch.float32), 0, 0),
    ("int64", torch.tensor([4, 0, 9], dtype=torch.int64), 0, 7),
):
    out[name] = expand_batch_to_tokens(x, cu, 6, replace_from=frm, replace_to=to).tolist()
print(json.dumps(out))
"""
EXPECTED = {
    "temperature": [0.7, 0.7, 0.7, 1.0, 1.0, 1.3],
    "top_k": [20, 20, 20, 5, 5, 1],
    "top_p": [0.8, 0.8, 0.8, 0.95, 0.95, 1.0],
    "int64": [4, 4, 4, 7, 7, 9],
}

# 20000 requests with the same two draft tokens and the same target rows, sampled at the scenario's settings; what the
# rejection sampler returns, and the target's filtered distribution at each position.
SAMPLER = r"""
import json, types, torch
from vllm.platforms import current_platform
current_platform.register_triton_kernel_overrides()
import vllm.v1.sample.rejection_sampler as rs

V, K, B = 50, 2, 20000
g = torch.Generator().manual_seed(7)
rows = torch.randn(K, V, generator=g) * 2.0
draft = torch.tensor([int(rows[0].argsort()[-3]), int(rows[1].argmax())], dtype=torch.int32)
md = types.SimpleNamespace(
    all_greedy=False, all_random=True, temperature=torch.full((B,), 0.7), generators={},
    top_k=torch.full((B,), 20, dtype=torch.int32), top_p=torch.full((B,), 0.8),
)
cu = (torch.arange(1, B + 1) * K).to(torch.int32)
logits = rs.apply_sampling_constraints(rows.repeat(B, 1), cu, md)
target = logits[:K].softmax(-1)
torch.manual_seed(1)
bonus = torch.multinomial(target[1], B, replacement=True).to(torch.int32).view(B, 1)
out = rs.rejection_sample(draft.repeat(B), [K] * B, K, cu, None, logits, bonus, md)
accepted = (out[:, :K] == draft.view(1, K)).int().cumprod(1).sum(1)

# with draft probabilities (a proposer that keeps them): drafts drawn from q, so the first token is distributed as p
q = torch.randn(K, V, generator=g).softmax(-1)
drawn = torch.stack([torch.multinomial(q[j], B, replacement=True, generator=g) for j in range(K)], 1)
torch.manual_seed(2)
out_q = rs.rejection_sample(drawn.reshape(-1).to(torch.int32), [K] * B, K, cu, q.repeat(B, 1), logits, bonus, md)

# a mixed batch: every other request greedy (temperature 0), the greedy kernel's rows
M = 2000
mixed_md = types.SimpleNamespace(
    all_greedy=False, all_random=False, temperature=torch.tensor([0.0, 0.7]).repeat(M // 2), generators={},
    top_k=torch.full((M,), 20, dtype=torch.int32), top_p=torch.full((M,), 0.8),
)
mixed_cu = cu[:M]
mixed_logits = rs.apply_sampling_constraints(rows.repeat(M, 1), mixed_cu, mixed_md)
torch.manual_seed(3)
out_m = rs.rejection_sample(draft.repeat(M), [K] * M, K, mixed_cu, None, mixed_logits, bonus[:M], mixed_md)
print(json.dumps({
    "first": out[:, 0].tolist(),
    "second_after_accept": out[accepted >= 1, 1].tolist(),
    "accepted": accepted.tolist(),
    "target": target.tolist(),
    "draft": draft.tolist(),
    "first_with_q": out_q[:, 0].tolist(),
    "mixed_greedy": out_m[0::2].tolist(),
    "mixed_accepted": (out_m[1::2, :K] == draft.view(1, K)).int().cumprod(1).sum(1).tolist(),
}))
"""


def gof(tokens: list[int], probs: list[float]) -> float:
    """The chi-square p-value of ``tokens`` against the exact distribution ``probs`` (cells expected below 5 pooled)."""
    counts = [0] * len(probs)
    for t in tokens:
        counts[t] += 1
    p: float = goodness_of_fit(counts, probs)["p"]
    return p


@pytest.fixture(scope="module")
def expanded(arms: Arms) -> dict[str, dict[str, list[float]]]:
    return {"stock": arms.stock.run_code_json(EXPAND), "series": arms.patched.run_code_json(EXPAND)}


def test_the_series_expands_each_requests_values(expanded: dict[str, dict[str, list[float]]]) -> None:
    for name, want in EXPECTED.items():
        assert expanded["series"][name] == pytest.approx(want), name


def test_stock_expands_only_int64(expanded: dict[str, dict[str, list[float]]]) -> None:
    """The premise: stock's float32 and int32 expands are not their requests' values (its int64 one is)."""
    stock = expanded["stock"]
    assert stock["int64"] == EXPECTED["int64"]
    assert any(stock[name] != pytest.approx(EXPECTED[name]) for name in ("temperature", "top_k", "top_p"))


@pytest.fixture(scope="module")
def sampled(arms: Arms) -> dict[str, dict[str, Any]]:
    return {
        "off": arms.patched.run_code_json(SAMPLER),
        "flag": arms.patched.with_env(FLAG).run_code_json(SAMPLER),
    }


def test_the_output_is_distributed_as_the_target(sampled: dict[str, dict[str, Any]]) -> None:
    off, flag = sampled["off"], sampled["flag"]
    p0, p1 = off["target"]
    assert sum(x > 0 for x in p0) > 2  # the premise: the filtered target keeps several tokens
    assert 0.05 < p0[off["draft"][0]] < 0.95  # and the first draft is accepted only sometimes
    for arm in (off, flag):
        assert gof(arm["first"], p0) > ALPHA
        assert gof(arm["second_after_accept"], p1) > ALPHA
    assert homogeneity(off["first"], flag["first"])["p"] > ALPHA


def test_the_same_drafts_are_accepted(sampled: dict[str, dict[str, Any]]) -> None:
    """The accept test is stock's, on the same uniform numbers: request by request the same accepted lengths."""
    off, flag = sampled["off"], sampled["flag"]
    assert flag["accepted"] == off["accepted"]
    assert 0 < sum(off["accepted"]) < 2 * len(off["accepted"])
    # a recovered token is never the rejected draft itself
    rejected_first = [t for t, a in zip(flag["first"], flag["accepted"]) if a == 0]
    assert rejected_first and flag["draft"][0] not in rejected_first


@pytest.fixture(scope="module")
def model() -> Path:
    """llama-target: its sampled outputs keep the n-gram proposer drafting at temperature 0.7; the random llama's do
    not (no counted step)."""
    return vllm_support.trained_target()


def test_draft_probabilities_and_greedy_requests(sampled: dict[str, dict[str, Any]]) -> None:
    """With draft probabilities (drafts drawn from q) the output is distributed as the target with the flag too; in a
    mixed batch the greedy requests keep the greedy kernel's tokens and the random ones stock's accept decisions."""
    off, flag = sampled["off"], sampled["flag"]
    p0 = off["target"][0]
    for arm in (off, flag):
        assert gof(arm["first_with_q"], p0) > ALPHA
    assert flag["mixed_greedy"] == off["mixed_greedy"]
    assert flag["mixed_accepted"] == off["mixed_accepted"]
    assert 0 < sum(off["mixed_accepted"]) < 2 * len(off["mixed_accepted"])


def census(arm: Arm, model: Path) -> dict[str, Any]:
    return vllm_support.census(arm, model, SCENARIO, steps=STEPS)


def test_stocks_engine_dies_on_a_sampled_speculative_step(arms: Arms, model: Path) -> None:
    with pytest.raises(ExternalCommandError, match="out of bounds for dimension 1"):
        census(arms.stock, model)


@pytest.fixture(scope="module")
def spec(arms: Arms, model: Path) -> dict[str, dict[str, Any]]:
    return vllm_support.census_flag(arms, model, SCENARIO, FLAG, steps=STEPS, stock=False)


def test_the_series_runs_sampled_speculation(spec: dict[str, dict[str, Any]]) -> None:
    for doc in spec.values():
        assert doc["scenario"] == SCENARIO and doc["steps"] == STEPS, doc["notes"]
        assert all(d > 0 for d in doc["detail"]["drafts"])  # every counted step verifies drafts
        tokens = doc["detail"]["tokens"]
        assert len(tokens) == 4 and all(len(t) > STEPS for t in tokens)


def test_the_flag_draws_no_vocabulary_wide_noise(spec: dict[str, dict[str, Any]], model: Path) -> None:
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    off, flag = spec["off"], spec["flag"]
    assert "VLLM_OVL_RECOVER_AT_REJECTION" in flag["detail"]["flags_read"]
    # stock's recovered tokens: a [4, vocab] row of exponentials every step, then the row of each seeded request
    # with drafts again (at least one a counted step)
    sampler = "vllm/v1/sample/rejection_sampler.py"
    wide = {s: n for s, n in off["sites"]["random-elements"] if s.startswith(sampler) and n >= STEPS * vocab}
    assert sum(wide.values()) >= STEPS * (4 + 1) * vocab, off["sites"]["random-elements"]
    flag_sites = dict(flag["sites"]["random-elements"])
    assert not set(wide) & set(flag_sites)
    assert all(n < STEPS * vocab for s, n in flag_sites.items() if s.startswith(sampler))
    assert flag["metrics"]["random-elements"] < off["metrics"]["random-elements"] - 4 * vocab
