"""Probe: speculative rounds through the real Generator.iterate_draftmodel_dflash_gen + Generator.iterate_gen, with
host syncs counted.

The generator methods, Job.receive_logits / get_input_ids_list / is_prefill_done and the samplers are the wheel's
own; the generator object, jobs (pages, sequences), target model and drafter are stand-ins: the target returns
logits that are a fixed function of (input id, position); the DFlash-like drafter proposes the target's greedy
chain with deterministic corruptions, so acceptance varies from round to round. Device tensors are `_devsim.Dev`
(CPU memory, is_cuda True), so the CUDA branches (pinned copies, synchronize) run, and every host read of device
data is counted as a sync (see _devsim).

payload: {"seed": int, "bsz": int, "block": int (drafter block; K = block - 1), "rounds": int, "sampler":
"greedy"|"temp"|"fused-temp"|"fused-minp", "drafter": "dflash"|"host" (host: drafts given as a host tensor, as
the n-gram path does), "embed": "device"|"host", "corrupt": percent, "first_token_job": bool (one job still at
its first token), "serial_job": bool (one job with a checkpoint: stock's serial path), "decode_rounds": int
(no-draft rounds first), "env": {...}} or {"cases": [...]}
"""

from __future__ import annotations

import random
import time
from types import SimpleNamespace
from typing import ClassVar

import torch
from _common import run_cases
from _devsim import SYNC, host_syncs, install_cuda_mocks, install_sampling_references

VOCAB = 96
PAGE = 256


def _truth(table: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    return table[(ids * 31 + pos * 17) % table.shape[0]]


def case(payload: dict) -> dict:
    import exllamav3.ext as ext_mod
    from exllamav3.generator import generator as gen_mod
    from exllamav3.generator.job import Job
    from exllamav3.generator.pagetable import Sequence
    from exllamav3.generator.sampler import custom
    from exllamav3.modules.embedding import Embedding

    standin = ext_mod.exllamav3_ext
    cuda = payload.get("device") == "cuda"     # device script: real CUDA tensors and kernels, wall time only
    if cuda:
        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.to("cuda")

        def host(t: torch.Tensor) -> torch.Tensor:
            return t.cpu()

        def pinned(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory()

        def to_device(t: torch.Tensor) -> torch.Tensor:
            return t.to("cuda", non_blocking=True)
    else:
        from _devsim import dev, host

        def pinned(t: torch.Tensor) -> torch.Tensor:
            return t

        def to_device(t: torch.Tensor) -> torch.Tensor:
            return dev(t) if not t.is_cuda else t
        install_cuda_mocks()
        install_sampling_references(standin)
        standin.calls.clear()
    SYNC.clear()

    seed = payload["seed"]
    bsz = payload.get("bsz", 2)
    block = payload.get("block", 8)
    K = block - 1
    g = torch.Generator().manual_seed(seed)
    table = (torch.randn((211, VOCAB), generator=g) * 3.0).half()
    table_dev = dev(table)
    corrupt = payload.get("corrupt", 30)

    def greedy_next(tok: int, pos: int) -> int:
        return int(torch.argmax(_truth(table, torch.tensor(tok), torch.tensor(pos)).float()))

    def chain(anchor: int, pos: int) -> list[int]:
        # the target's greedy continuation of anchor (at position pos), with deterministic corruptions
        out, tok = [], anchor
        for k in range(K):
            tok = greedy_next(tok, pos + k)
            if (anchor * 1_000_003 + pos * 7_919 + k * 104_729 + seed) % 100 < corrupt:
                tok = (tok + 1 + k) % VOCAB
            out.append(tok)
        return out

    # samplers
    kind = payload.get("sampler", "greedy")
    custom.fused_sampler_enable = kind.startswith("fused")

    def make_sampler():
        if kind == "greedy":
            return custom.CustomSampler([custom.SS_Argmax()])
        if kind in ("temp", "fused-temp"):
            return custom.CustomSampler([custom.SS_Temperature(0.7), custom.SS_Sample()])
        if kind == "fused-minp":
            return custom.CustomSampler([custom.SS_MinP(0.05), custom.SS_Temperature(0.9), custom.SS_Sample()])
        raise ValueError(kind)

    # jobs
    class FakePage:
        def __init__(self, index: int) -> None:
            self.page_index = index
            self.ref_count = 1
            self.kv_position = 0
            self.sequence = torch.zeros((1, PAGE), dtype=torch.long)
            self.can_revert = True

    class FakeJob:
        get_input_ids_list = Job.get_input_ids_list
        receive_logits = Job.receive_logits
        receive_logits_rows = getattr(Job, "receive_logits_rows", None)   # patched wheel only
        is_prefill_done = Job.is_prefill_done
        get_max_seq_len = Job.get_max_seq_len

        def __init__(self, i: int) -> None:
            self.identifier = i
            self.serial_number = i
            plen = int(torch.randint(200, 400, (1,), generator=g))
            prompt = torch.randint(0, VOCAB, (1, plen), generator=g)
            seq = Sequence(prompt, prompt)
            seq.allocated_pages = [FakePage(i * 8 + p) for p in range(6)]
            seq.kv_position = plen - 1
            for p, page in enumerate(seq.allocated_pages):
                n = max(0, min(PAGE, plen - 1 - p * PAGE))
                page.kv_position = n
                page.sequence[0, :n] = prompt[0, p * PAGE:p * PAGE + n]
            seq.build_block_index_tensor()
            self.sequences = [seq]
            self.time_first_token = 1.0
            self.alt_rope_offset = 0
            self.embeddings = []
            self.new_tokens = 3
            self.min_new_tokens = 0
            self.max_new_tokens = 10_000
            self.filters, self.filter_futures, self.logit_masks = [], [], []
            self.checkpoint = None
            self.forced_ids = None
            self.sampler = make_sampler()
            self.rng = random.Random(seed * 100 + i)
            self.checkpoint_rewound = False
            self.rejected_draft_tokens = 0
            self.accepted_draft_tokens = 0
            self.draft_stats = []
            self.recurrent_state = None
            self.current_device_ids = None
            self.generator = SimpleNamespace(tokenizer=None)
            self.device_logit_mask = None
            self.return_probs = False
            self.return_top_tokens = 0
            self.out = []

        def prepare_logit_mask(self) -> None:
            pass

        def prepare_sampling_past_ids(self) -> None:
            pass

        def deallocate_pages(self) -> None:
            pass

        def receive_sample(self, logits, next_token, k_tokens, k_probs, prob, results, *rest):
            next_token = next_token.cpu()
            tok = next_token.item()
            self.new_tokens += 1
            for seq in self.sequences:
                seq.sequence_ids.append(host(next_token).view(1, 1).long())
                seq.kv_position += 1
            self.out.append(tok)
            eos = self.new_tokens >= self.max_new_tokens
            if eos:
                results.append({"job": self, "stage": "streaming", "eos": True, "token": tok,
                                "rejected_draft_tokens": self.rejected_draft_tokens})
                return True, next_token, False
            results.append({"job": self, "stage": "streaming", "eos": eos, "token": tok})
            return eos, next_token, False

    jobs = [FakeJob(i) for i in range(bsz)]
    if payload.get("first_token_job"):
        jobs[0].new_tokens = 0
    if payload.get("serial_job"):
        jobs[-1].checkpoint = {"offset": 0}
    for i, job in enumerate(jobs):
        job.max_new_tokens = job.new_tokens + payload.get("max_new", 10_000)

    # target model
    forward_inputs = []

    class FakeModel:
        caps: ClassVar[dict] = {}
        loaded_tp = False

        def __init__(self) -> None:
            emb = Embedding.__new__(Embedding)
            weight = torch.zeros((VOCAB, 4))
            emb.embedding = SimpleNamespace(weight=dev(weight) if payload.get("embed", "device") == "device"
                                            else weight)
            self.modules = [emb]
            self.logit_layer_idx = 0

        def prefetch_tokens(self, ids) -> None:
            pass

        def forward(self, input_ids, params):
            on_device = isinstance(input_ids, torch.Tensor) and input_ids.is_cuda
            forward_inputs.append("device" if on_device else "host")
            if on_device and payload.get("embed", "device") == "host":
                input_ids = input_ids.to("cpu")      # a host-resident table gathers on the host
            ids = to_device(input_ids).long()
            seqlens = to_device(params["cache_seqlens"]).long()
            pos = seqlens.view(-1, 1) + to_device(torch.arange(ids.shape[1])).view(1, -1)
            logits = _truth(table_dev, ids, pos).clone()
            for _ in range(payload.get("work", 0)):    # device script: a forward's worth of GPU time
                logits = logits + (logits @ work_matrix)[..., :VOCAB] * 0.0
            return logits

    work_matrix = dev(torch.zeros((VOCAB, VOCAB), dtype=torch.half))

    # drafter
    kv_updates = []

    class DFlashLike:
        caps: ClassVar[dict] = {"dflash_draft": True, "default_draft_size": K}
        draft_verifier_params: ClassVar[dict] = {}
        config = SimpleNamespace(block_size=block)

        def forward(self, input_ids, params):
            return host(input_ids).clone(), host(params["cache_seqlens"]).clone()

        def sample_from_state(self, state, params):
            anchors, seqlens = state
            rows = [[a] + chain(a, p) for a, p in zip(anchors.view(-1).tolist(), seqlens.tolist())]
            return dev(torch.tensor(rows, dtype=torch.long))

        def update_kv_from_target(self, target_hidden, cache, lengths, params):
            kv_updates.append(list(lengths))

    staging: dict = {}

    def _staging(name, rows, width=None, dtype=torch.int32):
        key = (name, width)
        if key not in staging or staging[key].shape[0] < rows:
            staging[key] = pinned(torch.zeros((max(rows, 32),) if width is None else (max(rows, 32), width),
                                              dtype=dtype))
        return staging[key][:rows]

    arenas: dict = {}

    def _stage_arena(rows, width, with_positions):
        key = (rows, width, with_positions)
        if key not in arenas:
            t = pinned(torch.zeros((rows * width + rows * (2 if with_positions else 1),), dtype=torch.int32))
            arenas[key] = (t, gen_mod.Generator._arena_views(t, rows, width, with_positions), {})
        return arenas[key]

    def stage_decode(arena, width, seq_bi, seq_kvp, seq_rope, batch_ids, dec_ids, dec_pages, dec_offsets):
        rows = len(seq_bi)
        bi = arena[:rows * width].view(rows, width)
        bi.zero_()
        for r, (t, k) in enumerate(zip(seq_bi, seq_kvp)):
            n = min(width, t.shape[-1])
            bi[r, :n] = t[0, :n]
            arena[rows * width + r] = k
        if batch_ids is not None:
            for r, (ids, page, off) in enumerate(zip(dec_ids, dec_pages, dec_offsets)):
                tok = ids[0, seq_kvp[r]]
                batch_ids[r, 0] = tok
                page[0, off] = tok

    if not cuda:
        standin.REFERENCES["generator_stage_decode"] = stage_decode

    fake = SimpleNamespace(
        active_jobs=list(jobs), model=FakeModel(), cache="cache", draft_model=DFlashLike(), draft_cache="draft",
        draft_recurrent=False, draft_calibrator=None, _sparse_flag=None, sparse_head=None, hybrid_draft_tokens=0,
        draft_input_ids_pinned=pinned(torch.zeros((32, 1), dtype=torch.long)),
        draft_ids_pinned=pinned(torch.zeros((32, 16), dtype=torch.long)),
        _staging=_staging, _stage_arena=_stage_arena, _upload_arena=lambda *a: None, target_recurrent=False,
        filter_pool=None, record_draft_stats=False, dflash_draft=True, mtp_draft=False, recurrent_cache=None,
        sample_pinned=pinned(torch.zeros((32, 1), dtype=torch.long)),
        draft_sample_pinned=pinned(torch.zeros((1, 16), dtype=torch.long)),
        pending_jobs=[], _draft_conf_round=None,
    )
    fake.num_remaining_jobs = lambda: len(fake.active_jobs)
    fake.on_queue_drained = lambda: None

    results: list = []
    per_round = []
    accepted = []
    for _ in range(payload.get("decode_rounds", 0)):
        before = host_syncs()
        gen_mod.Generator.iterate_gen(fake, results, None)
        per_round.append({"kind": "decode", "syncs": host_syncs() - before})
    t_rounds = time.perf_counter()
    for r in range(payload.get("rounds", 6)):
        before = host_syncs()
        calls_before = standin.calls.copy()
        if payload.get("drafter", "dflash") == "dflash":
            drafts = gen_mod.Generator.iterate_draftmodel_dflash_gen(fake, results, K)
        else:
            live = [j for j in jobs if j in fake.active_jobs]
            drafts = torch.tensor([chain(int(j.sequences[0].sequence_ids.torch()[0, -1]),
                                         j.sequences[0].kv_position) for j in live], dtype=torch.long)
        acc_before = [j.accepted_draft_tokens for j in jobs]
        gen_mod.Generator.iterate_gen(fake, results, drafts)
        sampler_calls = sum((standin.calls - calls_before).values())
        per_round.append({"kind": "spec", "syncs": host_syncs() - before, "kernel_calls": sampler_calls})
        accepted.append([j.accepted_draft_tokens - a for j, a in zip(jobs, acc_before)])

    if cuda:
        torch.cuda.synchronize()
    rounds_s = time.perf_counter() - t_rounds
    pages = [[[p.kv_position, p.sequence[0, :p.kv_position].tolist()] for p in j.sequences[0].allocated_pages]
             for j in jobs]
    return {
        "tokens": [j.out for j in jobs],
        "results": [[r["job"].identifier, r["token"], r["eos"], r.get("rejected_draft_tokens")] for r in results],
        "accepted": accepted,
        "rejected": [j.rejected_draft_tokens for j in jobs],
        "pages": pages,
        "kv_positions": [j.sequences[0].kv_position for j in jobs],
        "rng": [j.rng.random() for j in jobs],
        "kv_updates": kv_updates,
        "per_round": per_round,
        "syncs": dict(SYNC),
        "forward_inputs": forward_inputs,
        "kernel_calls": dict(standin.calls) if not cuda else {},
        "rounds_s": round(rounds_s, 4) if cuda else None,
    }


if __name__ == "__main__":
    run_cases(case)
