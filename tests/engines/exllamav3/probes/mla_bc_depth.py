"""Probe: which path MLAttention.decode_flash_attn takes at each MTP draft depth (the graphed bc_mla step or the
dispatch path), and what the round's DSA share dict holds, for a full-indexer layer past the selection budget.

The real decode_flash_attn runs on a bare MLAttention (no weights). bc_mla_step (a CUDA graph replay) and _attend
(the dispatch path's kernels) are recorders: the graphed step writes its selection into params["dsa_topk_indices"]
as the real one does (a static buffer shared between layers), the dispatch path reports whether it found depth 0's
selection in the share dict.

payload: {"share": bool (pass params["dsa_mtp_share"] as the generator does with EXL3_OVL_MTP_INDEX_SHARE=1),
          "context": int, "depths": int}, or {"cases": [payload, ...]}
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from _common import run_cases


def case(P: dict[str, Any]) -> dict[str, Any]:
    import torch
    from exllamav3.modules import mla_attn
    from exllamav3.modules.mla_attn import MLAttention

    m = MLAttention.__new__(MLAttention)
    m.has_split_cache = False
    m.device = torch.device("cpu")
    m.layer_idx = 3
    m.indexer_mode = "full"
    m.index_topk = 64
    m.idx_plane_dim = 0
    calls = []
    static = torch.zeros((1, 64), dtype=torch.int32)

    def bc_mla_step(x: Any, params: Any, layer: Any, block_table: Any, cache_seqlens: Any) -> Any:
        static.copy_(torch.arange(64, dtype=torch.int32).view(1, 64) + 100 * params.get("draft_step", 0))
        params["dsa_topk_indices"] = static
        calls.append({"depth": params.get("draft_step", 0), "path": "graph"})
        return torch.zeros_like(x)

    def attend(x: Any, bsz: Any, seqlen: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        share = params.get("dsa_mtp_share")
        found = None if share is None else share.get(m.layer_idx)
        calls.append(
            {
                "depth": params.get("draft_step", 0),
                "path": "dispatch",
                "anchor": None if found is None else [found[0][0, :3].tolist(), found[1]],
            }
        )
        return torch.zeros_like(x)

    m.bc_mla_step = bc_mla_step
    m._attend = attend
    layer = SimpleNamespace(get_kv=lambda cache_seqlens, block_table: (None, None))  # fp16 MLA cache layer
    cache = SimpleNamespace(layers={(3, 0): layer})
    share: dict[Any, Any] | None = {} if P.get("share") else None
    ctx = P.get("context", 1000)
    for depth in range(P.get("depths", 3)):
        params = {
            "cache": cache,
            "block_table": torch.zeros((1, 8), dtype=torch.int32),
            "cache_seqlens": torch.tensor([ctx + depth], dtype=torch.int32),
            "draft_step": depth,
            "causal": True,
            "_mla_host_seqlens": [ctx + depth],
        }
        if share is not None:
            params["dsa_mtp_share"] = share
        m.decode_flash_attn(torch.zeros((1, 1, 32)), 1, 1, params)
    recorded = None if not share else {str(k): [v[0][0, :3].tolist(), v[1]] for k, v in share.items()}
    return {"calls": calls, "share": recorded, "bc_max_bsz": mla_attn._bc_max_bsz}


if __name__ == "__main__":
    run_cases(case)
