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
the n-gram path does), "embed": "device"|"host"|"loader" (loader: the real Embedding module, placed by the
loader's rule; "embed_on_device": true applies model_init's --embed_on_device first), "drafter_layers": "ring" (the
drafter's state side is the wheel's SlidingAttention ring code: _RingLayers), "ring_bits": [k_bits, v_bits] (those
rings quantized: Cache(swa_ring_bits=...), 0008; needs EXL3_OVL_SWA_RING=1), "corrupt": percent, "first_token_job": bool (one job still at
its first token), "serial_job": bool (one job with a checkpoint: stock's serial path), "decode_rounds": int
(no-draft rounds first), "env": {...}} or {"cases": [...]}
"""

from __future__ import annotations

import random
import time
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from _common import run_cases
from _devsim import SYNC, host_syncs, install_sampling_references
from _devsim import install_cuda_mocks as install_cuda_mocks  # re-exported: the census worker replaces it

VOCAB = 96
PAGE = 256
# the generator's staging buffers are pinned on CUDA; on CPU torch only a census (which emulates pinning) can say so
PIN_STAGING = False


def _truth(table: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    return table[(ids * 31 + pos * 17) % table.shape[0]]


def _loaded_embedding(model: Any, payload: dict[str, Any], dev: Any, device: Any) -> object:
    """A real exllamav3 Embedding, placed as the loader places it (model_ls.py: system RAM when the module's caps
    say prefer_cpu, else the device), from a stand-in tensor collection; with payload["embed_on_device"] the
    model first goes through model_init.embed_on_device (the --embed_on_device option; patched wheel only)."""
    from exllamav3.modules.embedding import Embedding

    key = "model.embed_tokens"
    weight = torch.zeros((VOCAB, 4))
    weight[:, 0] = torch.arange(VOCAB)

    class Collection:
        def has_tensor(self, name: str) -> bool:
            return name == key + ".weight"

        def get_tensor_handle(self, name: str, optional: bool = False) -> Any:
            return None

        def get_tensor(self, name: str, device: Any, **kwargs: Any) -> Any:
            assert name == key + ".weight", name
            on_host = torch.device(device).type == "cpu" and torch.device(device).index is None
            return weight.clone() if on_host else dev(weight.clone())

    config = SimpleNamespace(stc=Collection(), infer_params=SimpleNamespace(embed_stream_from_disk=False))
    emb = Embedding(config, key, VOCAB, 4)
    model.modules = [emb]
    if payload.get("embed_on_device"):
        from exllamav3 import model_init

        model_init.embed_on_device(model)
    emb.load(torch.device("cpu") if emb.caps.get("prefer_cpu") else torch.device(device))
    return emb


def case(payload: dict[str, Any]) -> dict[str, Any]:
    import exllamav3.ext as ext_mod
    from exllamav3.generator import generator as gen_mod
    from exllamav3.generator.job import Job
    from exllamav3.generator.pagetable import Sequence
    from exllamav3.generator.sampler import custom
    from exllamav3.modules.embedding import Embedding

    standin = ext_mod.exllamav3_ext
    cuda = payload.get("device") == "cuda"  # device script: real CUDA tensors and kernels, wall time only
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
            return t.pin_memory() if PIN_STAGING else t

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

    def device_chain(anchors: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # chain() with device ops only (no host read): the same tokens
        out, tok = [anchors], anchors
        for k in range(K):
            nxt = _truth(table_dev, tok, pos + k).float().argmax(dim=-1)
            h = (anchors * 1_000_003 + pos * 7_919 + k * 104_729 + seed) % 100
            tok = torch.where(h < corrupt, (nxt + 1 + k) % VOCAB, nxt)
            out.append(tok)
        return torch.stack(out, dim=1)

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

    def make_sampler() -> Any:
        if kind == "greedy":
            return custom.CustomSampler([custom.SS_Argmax()])
        if kind in ("temp", "fused-temp"):
            return custom.CustomSampler([custom.SS_Temperature(0.7), custom.SS_Sample()])
        if kind == "fused-minp":
            return custom.CustomSampler(
                [custom.SS_MinP(0.05), custom.SS_Temperature(0.9), custom.SS_Sample()]
            )
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
        receive_logits_rows = getattr(Job, "receive_logits_rows", None)  # patched wheel only
        is_prefill_done = Job.is_prefill_done
        get_max_seq_len = Job.get_max_seq_len

        def __init__(self, i: int) -> None:
            self.identifier = i
            self.serial_number = i
            plen = int(torch.randint(200, 400, (1,), generator=g))
            if payload.get("drafter_layers") == "ring":
                # a context past the ring drafter's window whose state is 9 + 2i rows short of full (ring of 768
                # rows, window start 256): the windows move in the first rounds
                plen = 256 + 768 - 9 - 2 * i + 1
            prompt = torch.randint(0, VOCAB, (1, plen), generator=g)
            seq = Sequence(prompt, prompt)
            seq.allocated_pages = [FakePage(i * 8 + p) for p in range(6)]
            seq.kv_position = plen - 1
            for p, page in enumerate(seq.allocated_pages):
                n = max(0, min(PAGE, plen - 1 - p * PAGE))
                page.kv_position = n
                page.sequence[0, :n] = prompt[0, p * PAGE : p * PAGE + n]
            seq.build_block_index_tensor()
            self.sequences = [seq]
            self.time_first_token = 1.0
            self.alt_rope_offset = 0
            self.embeddings: list[Any] = []
            self.new_tokens = 3
            self.min_new_tokens = 0
            self.max_new_tokens = 10_000
            self.filters: list[Any]
            self.filter_futures: list[Any]
            self.logit_masks: list[Any]
            self.filters, self.filter_futures, self.logit_masks = [], [], []
            self.checkpoint: dict[str, Any] | None = None
            self.forced_ids = None
            self.sampler = make_sampler()
            self.rng = random.Random(seed * 100 + i)
            self.checkpoint_rewound = False
            self.rejected_draft_tokens = 0
            self.accepted_draft_tokens = 0
            self.draft_stats: list[Any] = []
            self.recurrent_state: Any = None
            self.current_device_ids = None
            self.generator = SimpleNamespace(tokenizer=None)
            self.device_logit_mask = None
            self.return_probs = False
            self.return_top_tokens = 0
            self.out: list[Any] = []

        def prepare_logit_mask(self) -> None:
            pass

        def prepare_sampling_past_ids(self) -> None:
            pass

        def deallocate_pages(self) -> None:
            pass

        def receive_sample(
            self,
            logits: Any,
            next_token: Any,
            k_tokens: Any,
            k_probs: Any,
            prob: Any,
            results: Any,
            *rest: Any,
        ) -> Any:
            next_token = next_token.cpu()
            tok = next_token.item()
            self.new_tokens += 1
            for seq in self.sequences:
                seq.sequence_ids.append(host(next_token).view(1, 1).long())
                seq.kv_position += 1
            self.out.append(tok)
            eos = self.new_tokens >= self.max_new_tokens
            if eos:
                results.append(
                    {
                        "job": self,
                        "stage": "streaming",
                        "eos": True,
                        "token": tok,
                        "rejected_draft_tokens": self.rejected_draft_tokens,
                    }
                )
                return True, next_token, False
            results.append({"job": self, "stage": "streaming", "eos": eos, "token": tok})
            return eos, next_token, False

    jobs = [FakeJob(i) for i in range(bsz)]
    if payload.get("first_token_job"):
        jobs[0].new_tokens = 0
    if payload.get("serial_job"):
        jobs[-1].checkpoint = {"offset": 0}
    for _i, job in enumerate(jobs):
        job.max_new_tokens = job.new_tokens + payload.get("max_new", 10_000)

    def upload(x: torch.Tensor) -> torch.Tensor:
        # Module.prepare_for_device's rule for a host tensor: non-blocking from pinned memory, else blocking
        if not PIN_STAGING:
            return to_device(x)
        return x.to(table_dev.device, non_blocking=bool(x.is_pinned()))

    # target model
    forward_inputs = []
    embed_mode = payload.get("embed", "device")

    class FakeModel:
        caps: ClassVar[dict[str, Any]] = {}
        loaded_tp = False

        def __init__(self) -> None:
            self.logit_layer_idx = 0
            if embed_mode == "loader":
                self.modules: list[Any] = [
                    _loaded_embedding(self, payload, dev, "cuda:0" if cuda else torch.device("cpu", 0))
                ]
                return
            emb = Embedding.__new__(Embedding)
            weight = torch.zeros((VOCAB, 4))
            emb.embedding = SimpleNamespace(weight=dev(weight) if embed_mode == "device" else weight)
            self.modules = [emb]

        def prefetch_tokens(self, ids: Any) -> None:
            pass

        def forward(self, input_ids: Any, params: Any) -> Any:
            on_device = isinstance(input_ids, torch.Tensor) and input_ids.is_cuda
            forward_inputs.append("device" if on_device else "host")
            if embed_mode == "loader":
                # the real Embedding module: its own prepare_for_device and lookup; the table's column 0 holds
                # the token id, so the stand-in rest of the forward reads the ids from the embedding's output
                emb = self.modules[0]
                x = emb.forward(emb.prepare_for_device(input_ids, params), params)
                if not x.is_cuda:
                    x = upload(x)  # the first device layer's upload of the hidden state
                ids = x[..., 0].long()
            else:
                if on_device and embed_mode == "host":
                    input_ids = input_ids.to("cpu")  # a host-resident table gathers on the host
                ids = to_device(input_ids).long()
            seqlens = to_device(params["cache_seqlens"]).long()
            pos = seqlens.view(-1, 1) + to_device(torch.arange(ids.shape[1])).view(1, -1)
            logits = _truth(table_dev, ids, pos).clone()
            for _ in range(payload.get("work", 0)):  # device script: a forward's worth of GPU time
                logits = logits + (logits @ work_matrix)[..., :VOCAB] * 0.0
            return logits

    work_matrix = dev(torch.zeros((VOCAB, VOCAB), dtype=torch.half))

    # drafter
    kv_updates = []

    rings = _RingLayers(payload, dev, block) if payload.get("drafter_layers") == "ring" else None
    if rings is not None:
        for job, rs in zip(jobs, rings.states):
            rs.position = job.sequences[0].kv_position
            rs.window_beg = 256
            job.recurrent_state = SimpleNamespace(draft=rs, target=None)

    layer_box: list[Any] = []

    def input_layer() -> Any:
        """A DFlashInputLayer of the wheel (built without its loader: no fc/norm weights, which its forward does not
        use) attached to the stand-in target, whose module 0 is the real Embedding; mask token: the last id"""
        if not layer_box:
            from exllamav3.modules.arch_specific.dflash import DFlashInputLayer

            layer = DFlashInputLayer.__new__(DFlashInputLayer)
            layer.native_draft_len = block
            layer.mask_token_id = VOCAB - 1
            layer.input_embedding_scale = 1.0
            layer.attached_model = lambda: fake.model
            layer.device = (
                torch.device("cuda:0") if cuda else torch.device("cpu", 0)
            )  # the drafter's, as loaded
            layer_box.append(layer)
        return layer_box[0]

    class DFlashLike:
        caps: ClassVar[dict[str, Any]] = {"dflash_draft": True, "default_draft_size": K}
        draft_verifier_params: ClassVar[dict[str, Any]] = {}
        config = SimpleNamespace(block_size=block)

        def forward(self, input_ids: Any, params: Any) -> Any:
            if rings is not None:
                rings.forward(input_ids, params)
            if payload.get("device_drafter"):
                # the census's drafter: the wheel's own DFlashInputLayer.forward (the anchor and the block's mask
                # rows through the target's real Embedding; 0005's anchor-only path with cached mask rows under
                # EXL3_OVL_DFLASH_MASK_CACHE=1), the first device layer's upload of a host result, then device ops
                # only, reading the anchor's row (the table's column 0 holds the token id)
                x = input_layer().forward(input_ids, params)
                if not x.is_cuda:
                    x = upload(x)
                x = x[:, :1]
                seqlens = params["cache_seqlens"].to(table_dev.device, non_blocking=True)
                return x[..., 0].long(), seqlens
            return host(input_ids).clone(), host(params["cache_seqlens"]).clone()

        def sample_from_state(self, state: Any, params: Any) -> Any:
            anchors, seqlens = state
            if payload.get("device_drafter"):
                return device_chain(anchors.view(-1).long(), seqlens.view(-1).long())
            rows = [[a] + chain(a, p) for a, p in zip(anchors.view(-1).tolist(), seqlens.tolist())]
            return dev(torch.tensor(rows, dtype=torch.long))

        def update_kv_from_target(self, target_hidden: Any, cache: Any, lengths: Any, params: Any) -> None:
            kv_updates.append(list(lengths))
            if rings is not None:
                rings.write_back(list(lengths), params)

    staging: dict[tuple[Any, Any], Any] = {}

    def _staging(name: Any, rows: Any, width: Any = None, dtype: Any = torch.int32) -> Any:
        key = (name, width)
        if key not in staging or staging[key].shape[0] < rows:
            staging[key] = pinned(
                torch.zeros((max(rows, 32),) if width is None else (max(rows, 32), width), dtype=dtype)
            )
        return staging[key][:rows]

    arenas: dict[tuple[Any, Any, Any], Any] = {}

    def _stage_arena(rows: Any, width: Any, with_positions: Any) -> Any:
        key = (rows, width, with_positions)
        if key not in arenas:
            t = pinned(torch.zeros((rows * width + rows * (2 if with_positions else 1),), dtype=torch.int32))
            arenas[key] = (t, gen_mod.Generator._arena_views(t, rows, width, with_positions), {})
        return arenas[key]

    def stage_decode(
        arena: Any,
        width: Any,
        seq_bi: Any,
        seq_kvp: Any,
        seq_rope: Any,
        batch_ids: Any,
        dec_ids: Any,
        dec_pages: Any,
        dec_offsets: Any,
    ) -> None:
        rows = len(seq_bi)
        bi = arena[: rows * width].view(rows, width)
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
        active_jobs=list(jobs),
        model=FakeModel(),
        cache="cache",
        draft_model=DFlashLike(),
        draft_cache=rings.cache if rings is not None else "draft",
        draft_recurrent=rings is not None,
        draft_calibrator=None,
        _sparse_flag=None,
        sparse_head=None,
        hybrid_draft_tokens=0,
        draft_input_ids_pinned=pinned(torch.zeros((32, 1), dtype=torch.long)),
        draft_ids_pinned=pinned(torch.zeros((32, 16), dtype=torch.long)),
        _staging=_staging,
        _stage_arena=_stage_arena,
        _upload_arena=lambda *a: None,
        target_recurrent=False,
        filter_pool=None,
        record_draft_stats=False,
        dflash_draft=True,
        mtp_draft=False,
        recurrent_cache=None,
        sample_pinned=pinned(torch.zeros((32, 1), dtype=torch.long)),
        draft_sample_pinned=pinned(torch.zeros((1, 16), dtype=torch.long)),
        pending_jobs=[],
        _draft_conf_round=None,
    )
    fake.num_remaining_jobs = lambda: len(fake.active_jobs)
    fake.on_queue_drained = lambda: None

    results: list[Any] = []
    per_round = []
    accepted = []
    for _ in range(payload.get("decode_rounds", 0)):
        before = host_syncs()
        gen_mod.Generator.iterate_gen(fake, results, None)
        per_round.append({"kind": "decode", "syncs": host_syncs() - before})
    t_rounds = time.perf_counter()
    for _r in range(payload.get("rounds", 6)):
        before = host_syncs()
        calls_before = standin.calls.copy()
        if payload.get("drafter", "dflash") == "dflash":
            drafts = gen_mod.Generator.iterate_draftmodel_dflash_gen(fake, results, K)
        else:
            live = [j for j in jobs if j in fake.active_jobs]
            drafts = torch.tensor(
                [
                    chain(int(j.sequences[0].sequence_ids.torch()[0, -1]), j.sequences[0].kv_position)
                    for j in live
                ],
                dtype=torch.long,
            )
        acc_before = [j.accepted_draft_tokens for j in jobs]
        gen_mod.Generator.iterate_gen(fake, results, drafts)
        sampler_calls = sum((standin.calls - calls_before).values())
        per_round.append({"kind": "spec", "syncs": host_syncs() - before, "kernel_calls": sampler_calls})
        accepted.append([j.accepted_draft_tokens - a for j, a in zip(jobs, acc_before)])

    if cuda:
        torch.cuda.synchronize()
    rounds_s = time.perf_counter() - t_rounds
    pages = [
        [[p.kv_position, p.sequence[0, : p.kv_position].tolist()] for p in j.sequences[0].allocated_pages]
        for j in jobs
    ]
    return {
        "tokens": [j.out for j in jobs],
        "results": [
            [r["job"].identifier, r["token"], r["eos"], r.get("rejected_draft_tokens")] for r in results
        ],
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
        "embed_table": _table_placement(fake.model.modules[0]) if embed_mode == "loader" else None,
    }


class _RingLayers:
    """The state side of a DFlash2 drafter whose layers are all window rings (what --draft_window makes of every
    layer; window 256, 3 layers, 2 KV heads x 16), run by the wheel's own SlidingAttention code: per forward, every
    layer's _decode_state_prep (window decisions, block table, sequence lengths; stock: the shift copies) and the
    block's K/V appended through that table, then advance_recurrent_states; after verify, plan_state_rows /
    write_state_rows / commit_state_rows write the accepted rows (update_kv_from_target's write-back). Stood in:
    the projections and the attention kernel (the appended K/V rows are a fixed function of the position, written
    with device index ops through the table the wheel's code returns)."""

    def __init__(self, payload: dict[str, Any], dev: Any, block: int) -> None:
        import tempfile
        from pathlib import Path

        from _common import tiny_dflash2
        from exllamav3 import Cache, Config, Model

        self.block = block
        self._tmp = tempfile.TemporaryDirectory()
        directory = tiny_dflash2(
            Path(self._tmp.name) / "d",
            layers=3,
            layer_types=["sliding_attention"] * 3,
            window=256,
            hidden=64,
            kv_heads=2,
            head_dim=16,
            block=block,
        )
        self.model = Model.from_config(Config.from_directory(str(directory)))
        bsz = payload.get("bsz", 2)
        bits = payload.get("ring_bits")
        # ring_bits: the quantized rings (0008) that --draft_cache_quant gives the drafter with EXL3_OVL_SWA_RING=1;
        # their row writes run the quant kernel's CPU reference (the CUDA kernel's arithmetic, _qcache_real)
        quant = {"swa_ring_bits": tuple(bits)} if bits else {}
        if bits:
            import sys

            import _qcache_real

            _qcache_real.install(sys.modules["exllamav3_ext"])
        self.cache = Cache(self.model, max_num_tokens=256, max_batch_size=bsz, **quant)
        self.layers = list(self.model.attn_modules)
        device = torch.device("cpu", 0)
        for layer in self.layers:
            layer.device = device
        for state_layer in self.cache.recurrent_layers.values():
            state_layer.alloc(device if bits else "cpu")  # a quantized ring uploads its write tables there
            for name, t in list(vars(state_layer).items()):
                if isinstance(t, torch.Tensor) and name in ("k_state", "v_state", "qk", "qv", "sk", "sv"):
                    setattr(state_layer, name, dev(t))
        self.dev = dev
        self.states = [self.cache.get_new_state() for _ in range(bsz)]  # the jobs' draft states
        import inspect

        self.share = "params" in inspect.signature(self.layers[0]._decode_state_prep).parameters

    def _rows(self, like: torch.Tensor, n: int) -> torch.Tensor:
        return self.dev(torch.ones((n,) + tuple(like.shape[2:]), dtype=like.dtype))

    def forward(self, input_ids: Any, params: Any) -> None:
        from exllamav3.cache.recurrent_util import advance_recurrent_states

        seqlen = self.block  # the block: anchor + mask rows (DFlashInputLayer builds it from the anchor)
        states = params["recurrent_states"]
        for layer in self.layers:
            k, v = self.cache.get_recurrent_layer((layer.layer_idx, 0)).get_state_tensors()
            args = (states, k, v, seqlen) + ((params,) if self.share else ())
            bt, seqlens = layer._decode_state_prep(*args)
            # the attention kernel's append: row j of each sequence at its table's page for cache_pos + j
            j = torch.arange(seqlen, device=bt.device, dtype=torch.int32).as_subclass(type(bt))
            at = seqlens.view(-1, 1) + j.view(1, -1)
            flat = (bt.gather(1, (at // 256).long()) * 256 + at % 256).view(-1).long()
            rows = self._rows(k, flat.shape[0])
            k.view(-1, *k.shape[2:]).index_copy_(0, flat, rows)
            v.view(-1, *v.shape[2:]).index_copy_(0, flat, rows)
        advance_recurrent_states(input_ids, params, self.model)  # as Model.forward: by the anchor's one row

    def write_back(self, lengths: list[int], params: dict[str, Any]) -> None:
        # as dflash_update_kv_from_target: one plan from the first ring layer at the verify's positions
        states = params["recurrent_states"]
        layer0 = self.layers[0]
        plan = layer0.plan_state_rows(states, params["cache_seqlens"].tolist(), lengths, self.block)
        # the K/V the drafter projects from the target's hidden states: fp16 rows (2 KV heads x 16)
        k_rows = self.dev(torch.ones((len(lengths) * self.block, 2, 16), dtype=torch.half))
        k_rows = k_rows.view(len(lengths), self.block, -1, 16)
        for layer in self.layers:
            layer.write_state_rows(states, plan, k_rows, k_rows)
        layer0.commit_state_rows(states, plan)


def _table_placement(emb: Any) -> dict[str, Any]:
    weight = getattr(emb.embedding, "weight", None)
    return {
        "is_cuda": bool(weight is not None and weight.is_cuda),
        "caps": {k: emb.caps.get(k) for k in ("prefer_cpu", "x_cpu")},
    }


if __name__ == "__main__":
    run_cases(case)
