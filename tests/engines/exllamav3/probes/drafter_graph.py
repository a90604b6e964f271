"""Probe: block-drafting rounds through the real Generator.iterate_draftmodel_dflash_gen, with the whole-round drafter
graph (EXL3_OVL_DRAFTER_GRAPH=1) on a CPU model of CUDA graph capture.

torch.cuda.CUDAGraph / torch.cuda.graph are replaced by a recorder: during capture the stand-in drafter registers the
work it would have launched; replay re-runs that work. In "device" mode the recorded work reads the round's inputs
from the staging buffers at replay time (what a correct capture does: its host-to-device copies read the pinned
buffers again); in "stale" mode it replays the values seen at capture (what a capture with baked host-side values
would do). The drafter's output tensors are _devsim.Dev tensors (is_cuda True).

payload: {"seed": int, "bsz": int, "rounds": int, "mode": "device"|"stale"|"sync"|"conf"|"host"|"ring" (a window-ring
drafter: the wheel's SWAState and RingStepBuffer; its drafts depend on the ring tables),
"grow_at": int|null (a round from which one more job joins: new staging rows, new graph key), "env": {...}}
or {"cases": [...]}
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar, Literal

import torch
from _common import run_cases, staging_buffers
from _devsim import dev, host


class _Capture:
    current: FakeGraph | None = None


class FakeGraph:
    def __init__(self) -> None:
        self.ops: list[Any] = []
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for op in self.ops:
            op()


class _GraphContext:
    def __init__(self, graph: FakeGraph, **kwargs: Any) -> None:
        self.graph = graph

    def __enter__(self) -> Any:
        _Capture.current = self.graph
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        _Capture.current = None
        return False


def case(payload: dict[str, Any]) -> dict[str, Any]:
    from exllamav3.generator import generator as gen_mod

    torch.cuda.CUDAGraph = FakeGraph
    torch.cuda.graph = _GraphContext

    mode = payload.get("mode", "device")
    block = 8
    g = torch.Generator().manual_seed(payload["seed"])
    log = {"eager": 0, "captured_calls": 0}

    def compute(ids: torch.Tensor, seqlens: torch.Tensor) -> torch.Tensor:
        rows = []
        ring_rows = ([0] * ids.shape[0], [0] * ids.shape[0])
        if ring_bufs:  # a ring drafter's drafts depend on its device tables too (stale tables show)
            bt, ring_lens = ring_bufs[0]
            ring_rows = (host(ring_lens).tolist(), host(bt)[:, 0].tolist())
        for a, p, r, b in zip(ids.view(-1).tolist(), seqlens.tolist(), *ring_rows):
            rows.append(
                [a] + [(a * 31 + p * 7 + 5 * (k + 1) + r * 3 + b * 11) % 512 for k in range(block - 1)]
            )
        return torch.tensor(rows, dtype=torch.long)

    ring = mode == "ring"
    ring_bufs: list[Any] = []

    class Drafter:
        # DFlash-like (forward + sample_from_state), as stock's round requires
        caps: ClassVar[dict[str, Any]] = {"dflash_draft": True, "default_draft_size": block - 1}
        config = SimpleNamespace(block_size=block)
        draft_verifier_params: ClassVar[dict[str, Any]] = {}

        def forward(self, input_ids: Any, params: Any) -> Any:
            if ring:
                # a window-ring layer's decode step: the wheel's RingStepBuffer (what _decode_state_prep runs with
                # EXL3_OVL_SWA_RING_STATIC=1), then the state advance Model.forward makes (anchor ids: +1)
                from exllamav3.modules.sliding_attn import RingStepBuffer

                rsg = params["recurrent_states"]
                buf = RingStepBuffer.get(512, len(rsg), torch.device("cpu"))
                bt, seqlens = buf.step(rsg, block)
                if _Capture.current is not None:
                    _Capture.current.ops.append(lambda: buf.dev.copy_(buf.host))  # the captured upload
                ring_bufs[:] = [(bt, seqlens)]
                for rs in rsg:
                    rs.position += 1
                    rs.last_history = 0
                    rs.post_advance()
            return input_ids

        def sample_from_state(self, input_ids: Any, params: Any) -> Any:
            if mode == "conf":
                params["draft_confidence_len"] = block - 1
            graph = _Capture.current
            # the lengths reach the device once per round through the params' per-device cache, as
            # get_for_device does: an upload when the round has none yet, else the round's earlier upload
            cache = params.setdefault("dev_cache", {})
            if graph is None:
                log["eager"] += 1
                if "seqlens" not in cache:
                    cache["seqlens"] = params["cache_seqlens"].clone()
                out = compute(input_ids, cache["seqlens"])
                return out if mode == "host" else dev(out)
            if mode == "sync":
                raise RuntimeError("operation not permitted when stream is capturing")
            log["captured_calls"] += 1
            out = dev(torch.zeros((input_ids.shape[0], block), dtype=torch.long))
            if "seqlens" not in cache:
                cache["seqlens"] = torch.zeros_like(params["cache_seqlens"])
                staged, uploaded = params["cache_seqlens"], cache["seqlens"]
                graph.ops.append(lambda: uploaded.copy_(staged))  # captured upload: re-reads the buffer
            else:
                log["reused_upload"] = (
                    log.get("reused_upload", 0) + 1
                )  # a capture reusing an eager round's upload
            seqlens = cache["seqlens"]
            frozen = (input_ids.clone(), params["cache_seqlens"].clone())

            def work() -> None:
                src = frozen if mode == "stale" else (input_ids, seqlens)
                host(out).copy_(compute(*src))

            graph.ops.append(work)
            return out

    def job(i: int) -> Any:
        pos = int(torch.randint(300, 3000, (1,), generator=g))
        seq = SimpleNamespace(
            block_index_tensor=torch.arange(i * 64, i * 64 + 14, dtype=torch.int32).view(1, -1),
            kv_position=pos,
        )
        state = {"anchor": int(torch.randint(0, 511, (1,), generator=g))}

        def ids() -> Any:
            return [torch.tensor([[state["anchor"]]])]

        return SimpleNamespace(
            is_prefill_done=lambda: True,
            get_max_seq_len=lambda: seq.kv_position + 1,
            sequences=[seq],
            time_first_token=1.0,
            get_input_ids_list=ids,
            state=state,
            recurrent_state=SimpleNamespace(draft=None),
        )

    _staging = staging_buffers(4)
    bsz = payload.get("bsz", 2)
    jobs = [job(i) for i in range(bsz + 1)]
    draft_cache: Any = "draft-cache"
    if ring:
        # window-ring drafter states (the wheel's SWAState, kv_state_size 512) at the jobs' positions
        from exllamav3.modules.sliding_attn import SWALayerState, SWAState

        layer = SWALayerState.__new__(SWALayerState)
        draft_cache = SimpleNamespace(recurrent_layers={(0, 0): layer})
        for i, j in enumerate(jobs):
            rs = SWAState.__new__(SWAState)
            rs.slot, rs.wshift, rs.last_history = i, 0, 0
            rs.position = j.sequences[0].kv_position
            rs.window_beg = max(0, (rs.position - 300) // 256 * 256)
            j.recurrent_state = SimpleNamespace(draft=rs)
    ring_initial = (
        [[j.recurrent_state.draft.position, j.recurrent_state.draft.window_beg] for j in jobs]
        if ring
        else None
    )
    fake = SimpleNamespace(
        active_jobs=jobs[:bsz],
        _staging=_staging,
        draft_model=Drafter(),
        draft_cache=draft_cache,
        draft_recurrent=payload.get("recurrent", False) or ring,
        draft_calibrator=None,
        _sparse_flag=None,
        hybrid_draft_tokens=0,
        draft_input_ids_pinned=torch.zeros((8, 1), dtype=torch.long),
        draft_ids_pinned=torch.zeros((8, 16), dtype=torch.long),
    )
    drafts, expected = [], []
    for r in range(payload.get("rounds", 8)):
        if payload.get("grow_at") is not None and r == payload["grow_at"]:
            fake.active_jobs = jobs
        out = gen_mod.Generator.iterate_draftmodel_dflash_gen(fake, [], block - 1)
        n = len(fake.active_jobs)
        drafts.append(out[:n].tolist() if out is not None else None)
        anchors = torch.tensor([[j.state["anchor"]] for j in fake.active_jobs])
        seqlens = torch.tensor([j.sequences[0].kv_position for j in fake.active_jobs])
        expected.append(compute(anchors, seqlens)[:, 1:].tolist())
        for j, row in zip(fake.active_jobs, drafts[-1] or []):
            accepted = 1 + (j.state["anchor"] + r) % 5
            j.sequences[0].kv_position += accepted
            j.state["anchor"] = row[accepted - 1]
            if ring:  # the verify's write-back leaves the state at the new K/V position (commit_state_rows)
                ds = j.recurrent_state.draft
                ds.position, ds.last_history, ds.wshift = j.sequences[0].kv_position, 0, 0
    graphs = fake.__dict__.get("_ovl_round_graphs")
    return {
        "drafts": drafts,
        "expected": expected,
        "eager_calls": log["eager"],
        "captured_calls": log["captured_calls"],
        "reused_upload": log.get("reused_upload", 0),
        "graphs": None if graphs is None else graphs.status(),
        "ring_states": [[j.recurrent_state.draft.position, j.recurrent_state.draft.window_beg] for j in jobs]
        if ring
        else None,
        "ring_initial": ring_initial,
    }


if __name__ == "__main__":
    run_cases(case)
