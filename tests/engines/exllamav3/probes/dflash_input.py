"""Probe: DFlashInputLayer.forward (the drafter's block input) over random anchors, with a torch embedding table.

The target's embedding module is replaced by a torch table lookup (the real one stages rows through the CUDA
extension); it counts the rows it embeds. Outputs are returned as sha256 digests of their bytes.

payload: {"seed": int, "rounds": int, "bsz": int, "scale": float, "mask_embedding": bool, "swap": bool,
          "env": {"EXL3_OVL_DFLASH_MASK_CACHE": "1"}}, or {"cases": [payload, ...]}
"swap": half way, the target's embedding module is freed and replaced by one with another table that CPython
places at the same address (same id()), as a reloaded or replaced target can be; "id_reused" says it was.
"""

from __future__ import annotations

import hashlib
from typing import Any

from _common import run_cases


def case(PAYLOAD: dict[str, Any]) -> dict[str, Any]:
    import tempfile
    import weakref
    from pathlib import Path

    import torch
    from _common import tiny_dflash2
    from exllamav3 import Config, Model

    vocab, hidden = 512, 128
    gen = torch.Generator().manual_seed(PAYLOAD["seed"])
    table = torch.randn(vocab, hidden, generator=gen).half()
    embedded_rows = 0

    class TableEmbedding:
        def __init__(self, table: torch.Tensor) -> None:
            self.table = table

        def prepare_for_device(self, x: Any, params: Any) -> Any:
            return x  # the real Embedding's rule for a table in host memory: the ids stay where they are

        def forward(self, ids: Any, params: Any) -> Any:
            nonlocal embedded_rows
            params.setdefault("input_ids", ids)
            embedded_rows += ids.numel()
            return torch.nn.functional.embedding(ids, self.table).float()

    class Target:
        loaded_tp = False

        def __init__(self) -> None:
            self.modules = [TableEmbedding(table)]

    def swap_embedding(target: Target) -> bool:
        """Free the target's embedding module; allocate its replacement (another table) at the same address"""
        old_id = id(target.modules[0])
        target.modules = []
        new_table = torch.randn(vocab, hidden, generator=gen).half()
        held = []
        for _ in range(10000):
            emb = TableEmbedding(new_table)
            if id(emb) == old_id:
                break
            held.append(emb)
        target.modules = [emb]
        return id(emb) == old_id

    target = Target()
    with tempfile.TemporaryDirectory() as tmp:
        directory = tiny_dflash2(Path(tmp) / "d", hidden=hidden, vocab=vocab)
        model = Model.from_config(Config.from_directory(str(directory)))
        layer = model.input_layer
        layer.attached_model = weakref.ref(target)
        layer.input_embedding_scale = PAYLOAD.get("scale", 1.0)
        if PAYLOAD.get("mask_embedding"):
            layer.mask_embedding = torch.randn(hidden, generator=gen).half()
        digests, input_ids = [], []
        bsz = PAYLOAD.get("bsz", 1)
        id_reused = None
        for r in range(PAYLOAD.get("rounds", 20)):
            if PAYLOAD.get("swap") and r == PAYLOAD.get("rounds", 20) // 2:
                id_reused = swap_embedding(target)
            anchors = torch.randint(0, vocab - 1, (bsz, 1), generator=gen)
            params: dict[str, Any] = {}
            out = layer.forward(anchors, params)
            digests.append(hashlib.sha256(out.contiguous().numpy().tobytes()).hexdigest()[:16])
            input_ids.append(params["input_ids"].tolist())
        return {
            "digests": digests,
            "input_ids": input_ids,
            "embedded_rows": embedded_rows,
            "shape": list(out.shape),
            "dtype": str(out.dtype),
            "id_reused": id_reused,
        }


if __name__ == "__main__":
    run_cases(case)
