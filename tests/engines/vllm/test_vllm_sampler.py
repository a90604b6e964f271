"""0006 and 0007: the PyTorch sampling path (vLLM's CPU build) without the vocabulary-wide sort. 0006: with top-k and
top-p, top-p over the top-k candidates (``VLLM_OVL_TOPK_TOPP_PRESELECT=1``); 0007: top-p alone from the largest values
(``VLLM_OVL_TOPP_NUCLEUS=1``). Long: two arms and five engine runs through the census, ~1 minute each on the 2-core
machine.

- ``apply_top_k_top_p_pytorch`` in the stock arm and in the patched arm with the flag, on the same logits: the same
  output tensor (every value and every masked position) for float32 logits, the vocabulary sorted by neither; on logits
  rounded to bfloat16 (equal values are common there) the same number of tokens kept per row with the same values,
  only which of equal logits at the top-p cut may differ; a row without top-k (k = vocabulary) still takes the sort,
  with stock's output; without the flag the patched arm is stock.
- the census's ``decode-step-sampled`` (the engine's real sampler, seeded requests at top-k 20, top-p 0.8):
  ``sort-elements`` per step is the batch times the vocabulary in stock and 0 with the flag, and the seeded tokens are
  stock's.

- 0007, ``apply_top_k_top_p_pytorch`` with top-p alone: the same tokens kept as stock for float32 logits (in these
  cases; the two computations of the cut round differently, so a token whose mass lies within float32 rounding of
  ``1 - p`` could differ), the same count and values on bfloat16-rounded logits; a nucleus wider than 1024 tokens, or a
  row with p = 1, takes the sort with stock's output. The census's ``decode-step-top-p``: ``sort-elements`` 0 with the
  flag, the seeded tokens stock's.

Run against the stock wheel in the patched arm's place, the function tests and the census tests fail (the flag is then
never read: the census gives every metric None, and the vocabulary is sorted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import vllm_support

from overlay.check.envs import Arm, Arms

pytestmark = pytest.mark.long
FLAG = {"VLLM_OVL_TOPK_TOPP_PRESELECT": "1"}
NUCLEUS = {"VLLM_OVL_TOPP_NUCLEUS": "1"}
STEPS = 3

# One record per case: the logits, k and p drawn from a seeded generator, the function's output, and whether the
# vocabulary was sorted (aten.sort called on a tensor of the vocabulary's width). argv[1]: "top-k" (top-k with top-p)
# or "top-p" (top-p alone; every sixth case flat, its nucleus wider than 1024 tokens, every twelfth a row at p = 1).
FUNCTION = r"""
import json, sys, torch
from vllm.v1.sample.ops import topk_topp_sampler as m

sorted_widths = []
sort = torch.Tensor.sort
def counting_sort(self, *args, **kwargs):
    sorted_widths.append(self.shape[-1])
    return sort(self, *args, **kwargs)
torch.Tensor.sort = counting_sort

g = torch.Generator().manual_seed(0)
out = []
for case in range(48):
    rows, vocab = 1 + case % 4, 500 + 731 * case
    logits = torch.randn(rows, vocab, generator=g) * (0.5 + case % 7)
    bf16 = case % 2 == 1
    if bf16:
        logits = logits.to(torch.bfloat16).float()
    k = torch.randint(1, 64, (rows,), generator=g)
    if case % 12 == 5:
        k[0] = vocab  # a request without top-k
    p = torch.rand(rows, generator=g) * 0.9 + 0.05
    if sys.argv[1] == "top-p":
        k = None
        if case % 6 == 3:
            logits = torch.randn(rows, vocab, generator=g) * 0.5  # flat: the nucleus is most of the vocabulary
            p[:] = 0.95
        if case % 12 == 7:
            p[0] = 1.0  # a request without top-p beside ones with it
    sorted_widths.clear()
    res = m.apply_top_k_top_p_pytorch(logits.clone(), k, p, allow_cpu_sync=True)
    kept = [torch.nonzero(r > -float("inf")).flatten().tolist() for r in res]
    out.append({
        "bf16": bf16,
        "no_top_k": k is not None and bool((k == vocab).any()),
        "wide": sys.argv[1] == "top-p" and case % 6 == 3,
        "p_one": [bool(x == 1) for x in p],
        "vocab": vocab,
        "kept": kept,
        "values": [sorted(res[i, ids].tolist()) for i, ids in enumerate(kept)],
        "vocab_sorted": vocab in sorted_widths,
    })
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def function(arms: Arms) -> dict[str, list[dict[str, Any]]]:
    return {
        "stock": arms.stock.run_code_json(FUNCTION, "top-k"),
        "flag": arms.patched.with_env(FLAG).run_code_json(FUNCTION, "top-k"),
        "off": arms.patched.run_code_json(FUNCTION, "top-k"),
        "stock top-p": arms.stock.run_code_json(FUNCTION, "top-p"),
        "nucleus": arms.patched.with_env(NUCLEUS).run_code_json(FUNCTION, "top-p"),
        "off top-p": arms.patched.run_code_json(FUNCTION, "top-p"),
    }


def test_top_p_over_the_candidates_gives_the_sort_paths_output(
    function: dict[str, list[dict[str, Any]]],
) -> None:
    stock, flag = function["stock"], function["flag"]
    assert len(stock) == len(flag) == 48
    tie_only = 0
    for s, f in zip(stock, flag, strict=True):
        assert s["vocab_sorted"]  # the premise: stock sorts the vocabulary for every case
        assert f["vocab_sorted"] == s["no_top_k"]  # the flag sorts it only for a row without top-k
        assert [len(r) for r in f["kept"]] == [len(r) for r in s["kept"]]
        assert f["values"] == s["values"]  # the same kept logits in every row
        if f["kept"] != s["kept"]:
            assert s["bf16"] and not s["no_top_k"], s  # only among equal values, never for float32 logits
            tie_only += 1
    # float32 logits: the same tokens kept in every case (equal values at the cut do not occur there)
    assert all(f["kept"] == s["kept"] for s, f in zip(stock, flag, strict=True) if not s["bf16"])
    assert tie_only < len(stock) // 2


def test_top_p_alone_from_the_largest_values_keeps_the_sort_paths_tokens(
    function: dict[str, list[dict[str, Any]]],
) -> None:
    stock, nucleus = function["stock top-p"], function["nucleus"]
    assert len(stock) == len(nucleus) == 48
    fast = tie_only = 0
    for s, f in zip(stock, nucleus, strict=True):
        assert s["vocab_sorted"]  # the premise
        # the sort path, row by row, for a nucleus wider than the 1024 largest values or a row at p = 1
        sorted_rows = [len(r) > 1024 or one for r, one in zip(s["kept"], s["p_one"], strict=True)]
        if any(sorted_rows):
            assert f["vocab_sorted"], s["kept"]
        elif all(len(r) < 1000 for r in s["kept"]):  # (within the margin of 1024 either may happen)
            assert not f["vocab_sorted"], s["kept"]
        for i, (sr, fr) in enumerate(zip(s["kept"], f["kept"], strict=True)):
            assert len(fr) == len(sr) and f["values"][i] == s["values"][i]
            if fr != sr:  # only among equal values, on the new path
                assert s["bf16"] and not sorted_rows[i], (i, s["p_one"])
                tie_only += 1
            fast += not sorted_rows[i]
    assert fast >= 40 and tie_only < fast // 4
    # the flat cases sort: their nuclei are most of the vocabulary
    assert all(f["vocab_sorted"] for s, f in zip(stock, nucleus, strict=True) if s["wide"])


def test_without_the_flags_the_sampler_is_stocks(function: dict[str, list[dict[str, Any]]]) -> None:
    assert function["off"] == function["stock"]
    assert function["off top-p"] == function["stock top-p"]


# a batch of no rows: the rejection sampler's target positions in a speculative step where no request drafted
EMPTY = r"""
import json, torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

k, p = torch.empty(0, dtype=torch.int32), torch.empty(0)
print(json.dumps(list(apply_top_k_top_p_pytorch(torch.empty(0, 64), k, p, allow_cpu_sync=True).shape)))
"""


def test_a_batch_of_no_rows_comes_back_as_it_is(arms: Arms) -> None:
    assert arms.stock.run_code_json(EMPTY) == [0, 64]
    assert arms.patched.with_env(FLAG).run_code_json(EMPTY) == [0, 64]  # the first cut failed in k.max()


def census(arm: Arm, model: Path, scenario: str = "decode-step-sampled") -> dict[str, Any]:
    return vllm_support.census(arm, model, scenario, steps=STEPS)


@pytest.fixture(scope="module")
def sampled(arms: Arms, model: Path) -> dict[str, dict[str, Any]]:
    return vllm_support.census_flag(arms, model, "decode-step-sampled", FLAG, steps=STEPS) | {
        "stock top-p": census(arms.stock, model, "decode-step-top-p"),
        "nucleus": census(arms.patched.with_env(NUCLEUS), model, "decode-step-top-p"),
    }


def test_the_engines_sampler_no_longer_sorts_the_vocabulary(
    sampled: dict[str, dict[str, Any]], model: Path
) -> None:
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    stock, flag, off = (sampled[a] for a in ("stock", "flag", "off"))
    for doc in (stock, flag, off):
        assert doc["scenario"] == "decode-step-sampled" and doc["steps"] == STEPS, doc["notes"]
    assert stock["metrics"]["sort-elements"] == 4 * vocab  # the batch of 4, each row sorted
    assert [s for s, _ in stock["sites"]["sort-elements"]] == ["vllm/v1/sample/ops/topk_topp_sampler.py:494"]
    assert flag["metrics"]["sort-elements"] == 0
    assert "VLLM_OVL_TOPK_TOPP_PRESELECT" in flag["detail"]["flags_read"]
    assert off["metrics"]["sort-elements"] == stock["metrics"]["sort-elements"]


def test_the_seeded_tokens_are_stocks(sampled: dict[str, dict[str, Any]]) -> None:
    stock = sampled["stock"]["detail"]["tokens"]
    assert all(len(t) > STEPS for t in stock)
    assert sampled["flag"]["detail"]["tokens"] == stock
    assert sampled["off"]["detail"]["tokens"] == stock


def test_top_p_alone_no_longer_sorts_the_vocabulary(sampled: dict[str, dict[str, Any]], model: Path) -> None:
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    stock, nucleus = sampled["stock top-p"], sampled["nucleus"]
    assert stock["scenario"] == nucleus["scenario"] == "decode-step-top-p"
    assert stock["metrics"]["sort-elements"] == 4 * vocab
    assert nucleus["metrics"]["sort-elements"] == 0
    assert "VLLM_OVL_TOPP_NUCLEUS" in nucleus["detail"]["flags_read"]
    assert nucleus["detail"]["tokens"] == stock["detail"]["tokens"]
    assert all(len(t) > STEPS for t in stock["detail"]["tokens"])
