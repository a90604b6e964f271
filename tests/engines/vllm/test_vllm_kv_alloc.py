"""0005: the CPU KV cache is mapped from zero pages, not written with zeros (long: two cold starts of the real engine
through the check's ``cold-start`` census, 1-2 minutes each on the 2-core machine, and one short run in each arm).

The "stock" arm here is the series through 0004 (the patch's own effect, as ``overlay check --mechanism`` judges it),
the patched arm the whole series. The arms' env sets ``VLLM_CPU_KVCACHE_SPACE=1``: a 1 GiB cache.

- the worker's peak resident memory at the first token drops by most of the cache (measured 1.54 -> 0.54 GiB), the
  census's ``peak-memory`` decreases, the other processes' peaks do not move by more than noise, and the engine's
  tokens are unchanged;
- ``zero_pages`` gives zeros, writable, not resident until written, and alive after the mapping object is dropped.

Run against the series without 0005 in the patched arm's place, the first and the last fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arms, arms_for

pytestmark = pytest.mark.long
REPO = Path(__file__).resolve().parents[3]
GIB = 2**30
UPTO = 4  # the series before this patch


@pytest.fixture(scope="module")
def arms() -> Arms:
    before = arms_for(REPO, "vllm", upto=UPTO).patched
    return Arms(stock=before, patched=arms_for(REPO, "vllm").patched)


def peaks(doc: dict[str, Any]) -> dict[str, int]:
    found = {p["role"]: p["peak_rss_bytes"] for p in doc["detail"]["processes"] if p["counted"]}
    assert {"parent", "engine core", "worker"} <= set(found), found
    return found


def test_the_worker_does_not_hold_the_whole_kv_cache_at_start(cold: dict[str, dict[str, Any]]) -> None:
    before, after = peaks(cold["stock"]), peaks(cold["patched"])
    assert before["worker"] > GIB  # the premise: the zero-filled 1 GiB cache is resident
    assert after["worker"] < before["worker"] - 0.75 * GIB, (before, after)
    for role in ("parent", "engine core"):  # no KV cache there
        assert abs(after[role] - before[role]) < 0.1 * GIB, (role, before, after)
    assert cold["patched"]["metrics"]["peak-memory"] < cold["stock"]["metrics"]["peak-memory"] - 0.75 * GIB


def test_the_tokens_are_unchanged(cold: dict[str, dict[str, Any]]) -> None:
    stock, patched = cold["stock"]["detail"], cold["patched"]["detail"]
    assert patched["first_token"] == stock["first_token"]
    assert patched["greedy"] == stock["greedy"]


ZERO_PAGES = """
import gc, json
import torch
import vllm.v1.worker.utils as u

def resident():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096

size = 256 * 2**20
base = resident()
t = u.zero_pages(size)
fresh = resident() - base
zeros = bool((t[:: 4096] == 0).all()) and int(t[-4096:].abs().sum()) == 0
view = t[: 2**20].view(torch.float32)
view.fill_(1.5)
gc.collect()  # the mmap object has no name left but the tensor's
print(json.dumps({
    "dtype": str(t.dtype), "numel": t.numel(), "resident_after_alloc": fresh, "zeros": zeros,
    "written": float(view.sum()), "rest_zero": int(t[2**20:].abs().sum()) == 0,
    "empty": u.zero_pages(0).numel(),
}))
"""


def test_zero_pages_are_zeros_written_lazily(arms: Arms) -> None:
    out = arms.patched.run_code_json(ZERO_PAGES, timeout=600)
    assert out["dtype"] == "torch.int8" and out["numel"] == 256 * 2**20
    assert out["zeros"] and out["rest_zero"]
    assert out["resident_after_alloc"] < 16 * 2**20  # torch.zeros would make all 256 MiB resident here
    assert out["written"] == 1.5 * 2**18
    assert out["empty"] == 0
