"""Probe: one block-drafting round, Generator.iterate_draftmodel_dflash_gen, on a stand-in generator.

The method is the real one, called on a small object that carries what it reads (active jobs with their page
tables and positions, staging buffers, the draft model); buffers are plain CPU tensors instead of pinned ones. The
draft model is a recorder: "dflash" implements forward + sample_from_state like the DFlash drafters, "propose"
implements only propose_block with caps["block_drafter"] (the patched interface).

payload: {"seed": int, "bsz": int, "block": int, "window": int, "drafter": "dflash"|"propose", "conf_len": int|null}
or {"cases": [...]}
"""

from __future__ import annotations

from typing import Any

from _common import run_cases, staging_buffers


def case(payload: dict[str, Any]) -> dict[str, Any]:
    from types import SimpleNamespace

    import torch
    from exllamav3.generator import generator as gen_mod

    g = torch.Generator().manual_seed(payload["seed"])
    bsz, block, window = payload.get("bsz", 1), payload.get("block", 8), payload.get("window", 7)
    calls = []

    def sample(ids: torch.Tensor) -> torch.Tensor:
        # deterministic block per anchor: anchor echo, then a function of the anchor
        return torch.cat([ids] + [(ids * 31 + 7 * (j + 1)) % 512 for j in range(block - 1)], dim=1)

    class DFlashLike:
        def __init__(self) -> None:
            self.caps = {"dflash_draft": True, "default_draft_size": block - 1}
            self.config = SimpleNamespace(block_size=block)

        def forward(self, input_ids: Any, params: Any) -> Any:
            calls.append(["forward", input_ids.tolist(), sorted(params)])
            return input_ids.clone()

        def sample_from_state(self, state: Any, params: Any) -> Any:
            calls.append(["sample_from_state"])
            if payload.get("conf_len") is not None:
                params["draft_confidence_len"] = payload["conf_len"]
            return sample(state)

    class ProposeOnly:
        def __init__(self) -> None:
            self.caps = {"block_drafter": True, "default_draft_size": block - 1}
            self.block_size = block

        def propose_block(self, input_ids: Any, params: Any) -> Any:
            calls.append(["propose_block", input_ids.tolist(), sorted(params)])
            if payload.get("conf_len") is not None:
                params["draft_confidence_len"] = payload["conf_len"]
            return sample(input_ids)

    drafter = DFlashLike() if payload.get("drafter", "dflash") == "dflash" else ProposeOnly()

    def job(i: int) -> Any:
        pos = int(torch.randint(300, 3000, (1,), generator=g))
        pages = (pos + 255) // 256 + 1
        seq = SimpleNamespace(
            block_index_tensor=torch.arange(i * 64, i * 64 + pages, dtype=torch.int32).view(1, -1),
            kv_position=pos,
        )
        anchor = torch.randint(0, 511, (1, 1), generator=g)
        return SimpleNamespace(
            is_prefill_done=lambda: True,
            get_max_seq_len=lambda: pos + 1,
            sequences=[seq],
            time_first_token=1.0,
            get_input_ids_list=lambda: [anchor],
        )

    _staging = staging_buffers(32)
    staging = _staging.buffers

    fake = SimpleNamespace(
        active_jobs=[job(i) for i in range(bsz)],
        _staging=_staging,
        draft_model=drafter,
        draft_cache="draft-cache",
        draft_recurrent=False,
        draft_calibrator=None,
        _sparse_flag=None,
        draft_input_ids_pinned=torch.zeros((max(bsz, 32), 1), dtype=torch.long),
        draft_ids_pinned=torch.zeros((max(bsz, 32), 64), dtype=torch.long),
    )
    try:
        out = gen_mod.Generator.iterate_draftmodel_dflash_gen(fake, [], window)
    except AttributeError as e:
        return {"error": f"AttributeError: {e}"}
    return {
        "draft": None if out is None else out[:bsz].tolist(),
        "calls": calls,
        "block_table": staging[("draft_block_index", 16)][:bsz].tolist()
        if ("draft_block_index", 16) in staging
        else None,
        "seqlens": staging[("draft_cache_seqlens", None)][:bsz].tolist(),
    }


if __name__ == "__main__":
    run_cases(case)
