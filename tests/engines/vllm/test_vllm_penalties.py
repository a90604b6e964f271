"""0008: the repetition, frequency and presence penalties at the tokens the requests have seen, not over
vocabulary-wide count tensors, on the PyTorch sampling path (vLLM's CPU build; ``VLLM_OVL_SPARSE_PENALTIES=1``).
Long: two arms and three engine runs through the census, ~1 minute each on the 2-core machine.

- ``apply_all_penalties`` (what the sampler and the rejection sampler call) in the stock arm and in the patched arm
  with the flag, on the same seeded cases (1-5 rows, vocabularies of 50-20000, prompts padded to the longest, outputs
  of 0-300 tokens with async scheduling's -1 placeholders, penalties of either sign, rows without penalties beside
  ones with them, logits at 0 and -inf): the same output bytes in every case, stock allocating [rows, vocab + 1]
  count tensors and the flag none; without the flag the patched arm is stock.
- the census's ``decode-step-penalties`` (the engine's real sampler, seeded requests at temperature 0.7 with all three
  penalties): stock allocates the two count tensors every step (``alloc-bytes`` at ``layers/utils.py:33``), the flag
  none of them, the step's allocated bytes fall by more than they (and its peak on this model), the flag is read, and
  the seeded tokens are stock's.

Run against the stock wheel in the patched arm's place, the function test and the census tests fail (the count tensors
are allocated, and the flag is never read: the census gives every metric None).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import vllm_support

from overlay.check.envs import Arms

pytestmark = pytest.mark.long
FLAG = {"VLLM_OVL_SPARSE_PENALTIES": "1"}
STEPS = 3

# One record per case: a digest of apply_all_penalties's output and the widths of the 2-d int64 tensors torch.zeros
# made during the call (the count tensors are [rows, vocab + 1]).
FUNCTION = r"""
import hashlib, json, torch
from vllm.v1.sample.ops.penalties import apply_all_penalties

zero_widths = []
zeros = torch.zeros
def counting_zeros(*size, **kwargs):
    t = zeros(*size, **kwargs)
    if t.dim() == 2 and t.dtype == torch.int64:
        zero_widths.append(t.shape[1])
    return t
torch.zeros = counting_zeros

g = torch.Generator().manual_seed(0)
out = []
for case in range(60):
    rows = 1 + case % 5
    vocab = 50 + (case * 331) % 20000
    logits = torch.randn(rows, vocab, generator=g) * (1 + case % 4)
    if case % 5 == 0:
        logits[:, :7] = 0.0
        logits[:, 7:12] = -float("inf")
    width = int(torch.randint(1, 300, (1,), generator=g))
    prompt = torch.randint(0, vocab, (rows, width), generator=g)
    for i in range(rows):
        prompt[i, int(torch.randint(1, width + 1, (1,), generator=g)):] = vocab  # the input batch's padding
    output = []
    for i in range(rows):
        n = int(torch.randint(0, 300, (1,), generator=g)) if case % 7 else 0
        seen = torch.randint(0, min(vocab, 64), (n,), generator=g).tolist()  # repeats: counts above 1
        if case % 6 == 1 and seen:
            seen[-1] = -1  # async scheduling's placeholder for a token not sampled yet
        output.append(seen)
    presence = torch.rand(rows, generator=g) * 2 - 0.5
    frequency = torch.rand(rows, generator=g) * 2 - 0.5
    repetition = torch.rand(rows, generator=g) + 0.6
    if case % 3 == 0:
        presence[0], frequency[0], repetition[0] = 0.0, 0.0, 1.0  # a request without penalties in the batch
    zero_widths.clear()
    res = apply_all_penalties(logits.clone(), prompt, presence, frequency, repetition, output)
    out.append({
        "digest": hashlib.sha256(res.numpy().tobytes()).hexdigest(),
        "changed": int((res != logits).sum()),
        "vocab_wide": vocab + 1 in zero_widths,
    })
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def function(arms: Arms) -> dict[str, list[dict[str, Any]]]:
    return {
        "stock": arms.stock.run_code_json(FUNCTION),
        "flag": arms.patched.with_env(FLAG).run_code_json(FUNCTION),
        "off": arms.patched.run_code_json(FUNCTION),
    }


def test_penalties_at_the_seen_tokens_give_stocks_logits(function: dict[str, list[dict[str, Any]]]) -> None:
    stock, flag = function["stock"], function["flag"]
    assert len(stock) == len(flag) == 60
    assert all(s["vocab_wide"] for s in stock)  # the premise: stock counts over the whole vocabulary
    assert sum(s["changed"] > 0 for s in stock) >= 50  # the penalties change logits in (nearly) every case
    assert [f["digest"] for f in flag] == [s["digest"] for s in stock]  # the same bytes
    assert not any(f["vocab_wide"] for f in flag)


def test_without_the_flag_the_penalties_are_stocks(function: dict[str, list[dict[str, Any]]]) -> None:
    assert function["off"] == function["stock"]


@pytest.fixture(scope="module")
def penalized(arms: Arms, model: Path) -> dict[str, dict[str, Any]]:
    return vllm_support.census_flag(arms, model, "decode-step-penalties", FLAG, steps=STEPS)


def test_the_engines_penalties_no_longer_allocate_vocabulary_wide_counts(
    penalized: dict[str, dict[str, Any]], model: Path
) -> None:
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    counts = 2 * 4 * (vocab + 1) * 8  # stock's two int64 count tensors for the batch of 4, every step
    stock, flag, off = (penalized[a] for a in ("stock", "flag", "off"))
    for doc in (stock, flag, off):
        assert doc["scenario"] == "decode-step-penalties" and doc["steps"] == STEPS, doc["notes"]
    assert "VLLM_OVL_SPARSE_PENALTIES" in flag["detail"]["flags_read"]
    assert dict(stock["sites"]["alloc-bytes"])["vllm/model_executor/layers/utils.py:33"] == STEPS * counts
    assert not any(
        s.startswith("vllm/model_executor/layers/utils.py") for s, _ in flag["sites"]["alloc-bytes"]
    )
    assert stock["metrics"]["alloc-bytes"] - flag["metrics"]["alloc-bytes"] > counts
    assert (
        flag["metrics"]["peak-memory"] < stock["metrics"]["peak-memory"]
    )  # on this model the counts set the peak
    assert off["metrics"] == stock["metrics"]


def test_the_seeded_tokens_are_stocks(penalized: dict[str, dict[str, Any]]) -> None:
    stock = penalized["stock"]["detail"]["tokens"]
    assert all(len(t) > STEPS for t in stock)
    assert penalized["flag"]["detail"]["tokens"] == stock
    assert penalized["off"]["detail"]["tokens"] == stock
