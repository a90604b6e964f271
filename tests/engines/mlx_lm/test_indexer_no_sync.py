"""The DSA indexer preselection reads nothing back in a decode step (patch deepseek_v32: preselect indexer top-k
by block maxima).

Its tie check called ``.item()`` on every indexer call: one device sync per layer per decode step (61 layers on
DeepSeek-V3.2), which stalls MLX's lazy pipeline (review F5.8). Now only masked calls (prefill chunks) check ties;
a decode step stays lazy. ``mx.compile`` refuses any evaluation inside a traced function, so the probe
(probes/indexer_sync.py) compiles the preselection on decode-shaped scores: it must trace (and select the same
index set as a full argpartition), while the masked variant still refuses (it keeps the host check). The index
sets of real indexer calls are compared with stock by test_fused_dispatch.py::test_indexer_topk_preselect.
"""

from __future__ import annotations

from pathlib import Path

from overlay.check.envs import Arms

PROBE = Path(__file__).parent / "probes" / "indexer_sync.py"


def test_decode_preselection_has_no_readback(arms: Arms) -> None:
    for T, k in ((32768, 256), (131072, 2048)):
        res = arms.patched.run_json(PROBE, {"T": T, "k": k, "seed": 1})
        assert res["decode"]["compiles"], f"T={T} k={k}: {res['decode']['error']}"
        assert res["decode"]["same_set"], f"T={T} k={k}: another index set than argpartition"
        assert not res["masked"]["compiles"] and "eval" in res["masked"]["error"]
