"""Probe: does the DSA indexer's top-k preselection read back from the device in a decode step?

Payload: {"T": keys, "k": index_topk, "seed": s}. Decode-shaped scores (1 x 1 x 1 x T, random normal, no ties).
``mx.compile`` refuses any evaluation inside the traced function, so a preselection that calls ``.item()`` cannot
be compiled: that is the check. Result: {"decode": {"compiles": bool, "error", "same_set": index set equals
argpartition's}, "masked": the same with the tie check (exact_ties=True, what masked prefill calls use)}.
"""

from __future__ import annotations

import inspect
from typing import Any

import mlx.core as mx
import numpy as np
from probe_io import emit, read_payload

if __name__ == "__main__":
    payload = read_payload()
    from mlx_lm.models.deepseek_v32 import _preselected_topk

    T, k = payload["T"], payload["k"]
    mx.random.seed(payload.get("seed", 0))
    scores = mx.random.normal((1, 1, 1, T))
    ref = np.sort(np.array(mx.argpartition(scores, kth=-k, axis=-1)[..., -k:]), axis=-1)
    has_flag = "exact_ties" in inspect.signature(_preselected_topk).parameters
    out: dict[str, dict[str, Any]] = {}
    for name, exact in (("decode", False), ("masked", True)):
        kwargs = {"exact_ties": exact} if has_flag else {}
        try:
            got = mx.compile(lambda s, kw=kwargs: _preselected_topk(s, k, **kw))(scores)
            out[name] = {
                "compiles": True,
                "error": None,
                "same_set": bool(np.array_equal(np.sort(np.array(got), axis=-1), ref)),
            }
        except Exception as exc:
            out[name] = {"compiles": False, "error": f"{type(exc).__name__}: {exc}"[:300], "same_set": None}
    emit({"has_flag": has_flag, **out})
