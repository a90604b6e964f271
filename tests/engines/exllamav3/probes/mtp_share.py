"""Probe: MTP drafting rounds through the real Generator.iterate_draftmodel_mtp_gen with a recording MTP head, and the
shared DSA selection of the patched MLAttention (mtp_extend_selection) against a set-based reference.

The head records, per draft depth, the params it receives (keys, draft_step, the identity of the per-round share
dict); its draft tokens are a fixed function of the inputs. Selections: random anchors (-1 padded rows of key
positions <= the anchor query position), extended for depths 1..4.

payload: {"seed": int, "bsz": int, "rounds": int, "window": int, "share_caps": bool, "env": {...}} or {"cases": [...]}
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from _common import run_cases, staging_buffers


def _selection_checks(seed: int) -> dict[str, Any]:
    from exllamav3.modules import mla_attn

    extend = getattr(mla_attn, "mtp_extend_selection", None)
    if extend is None:
        return {"available": False}
    g = torch.Generator().manual_seed(seed)
    failures: list[list[Any]] = []
    trials = 0
    for _ in range(40):
        bsz = int(torch.randint(1, 4, (1,), generator=g))
        k_pad = 32 * int(torch.randint(1, 4, (1,), generator=g))
        anchor_len = [int(torch.randint(k_pad, 4 * k_pad, (1,), generator=g)) for _ in range(bsz)]
        rows = []
        for a in anchor_len:
            chosen = torch.randperm(a + 1, generator=g)[: k_pad - int(torch.randint(0, 5, (1,), generator=g))]
            row = torch.full((k_pad,), -1, dtype=torch.int32)
            row[: chosen.numel()] = chosen.to(torch.int32)
            rows.append(row)
        anchor = torch.stack(rows)
        for depth in range(1, 5):
            trials += 1
            seqlens = [a + depth for a in anchor_len]
            out = extend(anchor, anchor_len, seqlens)
            for b in range(bsz):
                got = [int(v) for v in out[b] if v >= 0]
                want = {int(v) for v in anchor[b] if v >= 0} | set(range(anchor_len[b] + 1, seqlens[b] + 1))
                if len(got) != len(set(got)) or set(got) != want or max(got) > seqlens[b]:
                    failures.append([bsz, k_pad, depth, b])
            if out.shape[1] % 32 or out.dtype != anchor.dtype:
                failures.append(["shape", list(out.shape)])
    same = extend(anchor, anchor_len, anchor_len)
    return {"available": True, "trials": trials, "failures": failures, "depth0_identity": same is anchor}


def case(payload: dict[str, Any]) -> dict[str, Any]:
    from exllamav3.generator import generator as gen_mod

    g = torch.Generator().manual_seed(payload["seed"])
    bsz = payload.get("bsz", 2)
    window = payload.get("window", 3)
    seen = []

    class Head:
        caps: ClassVar[dict[str, Any]] = {"mtp_draft": True, "default_draft_size": window}
        if payload.get("share_caps"):
            caps["mtp_index_share"] = True

        def forward(self, input_ids: Any, params: Any) -> Any:
            share = params.get("dsa_mtp_share")
            seen.append(
                {
                    "step": params["draft_step"],
                    "keys": sorted(params),
                    "share": None if share is None else [id(share), len(share)],
                }
            )
            if share is not None:
                share.setdefault(0, params["draft_step"])  # what a depth-0 layer stores
            return torch.zeros((input_ids.shape[0], 1, 8)) + input_ids.view(-1, 1, 1).float()

        def sample_from_state(self, state: Any, params: Any) -> Any:
            return (state[:, :, 0].long() * 7 + params["draft_step"] + 3) % 500

    def job(i: int) -> Any:
        pos = int(torch.randint(300, 3000, (1,), generator=g))
        seq = SimpleNamespace(
            block_index_tensor=torch.arange(i * 64, i * 64 + 14, dtype=torch.int32).view(1, -1),
            kv_position=pos,
        )
        anchor = int(torch.randint(0, 499, (1,), generator=g))
        return SimpleNamespace(
            is_prefill_done=lambda: True,
            get_max_seq_len=lambda: pos + 1,
            sequences=[seq],
            time_first_token=1.0,
            get_input_ids_list=lambda: [torch.tensor([[anchor]])],
            mtp_last_hidden=torch.zeros((1, 1, 8)),
        )

    _staging = staging_buffers(4)

    lm = SimpleNamespace(prepare_for_device=lambda x, params: x)
    fake = SimpleNamespace(
        active_jobs=[job(i) for i in range(bsz)],
        _staging=_staging,
        draft_model=Head(),
        draft_cache="draft",
        cache="cache",
        draft_calibrator=None,
        _sparse_flag=None,
        target_recurrent=False,
        hybrid_draft_tokens=0,
        model=SimpleNamespace(modules=[SimpleNamespace(device=torch.device("cpu")), lm], logit_layer_idx=1),
        draft_input_ids_pinned=torch.zeros((8, 1), dtype=torch.long),
        draft_ids_pinned=torch.zeros((8, 16), dtype=torch.long),
    )
    drafts = []
    for _ in range(payload.get("rounds", 2)):
        out = gen_mod.Generator.iterate_draftmodel_mtp_gen(fake, [], window)
        drafts.append(out[:bsz].tolist())
    shares = [s["share"] for s in seen]
    per_round = [shares[i : i + window] for i in range(0, len(shares), window)]
    # per round: [distinct share dicts across its depths, entries each depth found on arrival]
    share_per_round = [
        None if r[0] is None else [len({x[0] for x in r}), [x[1] for x in r]] for r in per_round
    ]
    return {
        "drafts": drafts,
        "steps": [s["step"] for s in seen],
        "keys": [s["keys"] for s in seen],
        "share_per_round": share_per_round,
        "selection": _selection_checks(payload["seed"]),
    }


if __name__ == "__main__":
    run_cases(case)
