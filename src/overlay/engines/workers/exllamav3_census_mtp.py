"""ExLlamaV3 census scenario ``draft-round`` with an MTP drafter (request field ``"drafter": "mtp"``; called by
exllamav3_census.py's ``census()``; runs inside an exllamav3 arm with the labelled stand-in extension).

What runs: the wheel's own ``Generator.iterate_draftmodel_mtp_gen`` (the MTP round: the batch's block table and
lengths in pinned staging, one head forward per draft depth with ``draft_step``, the drafted ids staged back; with
patch 0019's EXL3_OVL_MTP_INDEX_SHARE=1 and the head's caps["mtp_index_share"] the per-round share dict) and, inside
the head's forward at every depth, the wheel's own ``MLAttention.forward`` -> ``decode_flash_attn`` -> ``_attend`` of
a DSA full-indexer MLA layer (GLM-5.2's MTP attention) past its selection budget: the BC-graph decision, the uploads
of the block table and lengths (``get_for_device``), the sparse decision, the latent and indexer-key appends through
the wheel's ``CacheLayer_MLA_fp16``, the indexer's selection (``_indexer_topk``: its q projection, RoPE, head
weights, per-row scoring and top-k) or, with 0019, ``mtp_extend_selection``, and the sparse attention's call.

What is stood in (the same in every arm), each labelled in the response's "standin":
- the head around the attention (embedding, enorm/hnorm, eh_proj before it; the MoE block, shared head and sampling
  after it): one kernel each (``torch_census.Census.kernel``: one launch, its torch work not counted);
- the layer's projections (q_a_proj, q_b_proj, kv_a_proj_with_mqa, o_proj, idx_wq_b, idx_wk, idx_weights): one fp16
  matmul each (visible torch ops: F.linear on a 3-D input reaches no aten op the census sees; an EXL3 GEMM reads quantized weights where these read fp16);
- the norms (q_a_layernorm, kv_a_layernorm, idx_k_norm), RoPE (``rope.apply``; ``exllamav3_ext.rope`` for the indexer),
  ``exllamav3_ext.dsa_topk`` and the Triton kernels (``mla_absorb``, ``mla_unfold``, ``mla_kv_append``,
  ``mla_plane_append``, ``dsa_indexer_scores``, ``dsa_attn``): one kernel launch per call, a torch reference inside
  (``dsa_indexer_scores`` scores the real indexer plane; its operand bytes, queries, head weights and the keys it
  reads, are counted as gemm-bytes since its work is a GEMM over the context);
- the BC graph (``bc_mla_step``): off (``mla_attn._bc_mla_enable = False``, what EXL3_BC_MLA=0 gives, and the path
  every layer the graph declines takes), or with ``"bc_mla": true`` one graph replay counted as one graph launch
  per call that writes its selection as the graph's static does (the real graph is a compiled CUDA graph of the
  whole decode block; its kernel count is not known on CPU).

Request fields read here: "steps" (rounds counted after WARMUP rounds), "bsz" (1..4, default 2), "depths" (draft
depths per round, 2..8, default 4), "context" (the jobs' K/V positions, > the selection budget INDEX_TOPK, default
1000), "bc_mla" (bool, default false). "ring_bits" and model_init options are refused.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, ClassVar

from census_sites import census_record, judged_flags

SCENARIO, TAG = "draft-round", "draft"
WARMUP = 1  # the first round allocates the staging buffers and the scoring backings
FLAG_PREFIX = "EXL3_OVL_"
# a tiny GLM-5.2-shaped MTP attention layer: DSA full indexer, q LoRA, no kpool
HIDDEN, HEADS, Q_LORA, NOPE, ROPE, KV_LORA, V_DIM = 64, 4, 32, 32, 16, 64, 32
IDX_HEADS, IDX_DIM, INDEX_TOPK, VOCAB, LAYER_IDX = 4, 32, 256, 128, 3
PAGES_PER_ROW = 8  # 2048 tokens of cache per batch row
STANDIN = (
    "the MTP head around its attention (embedding/eh_proj, MoE block, shared head, sampling: one kernel each), the "
    "MLA layer's projections (one fp16 matmul each, where EXL3 GEMMs read quantized weights), norms, RoPE, "
    "exllamav3_ext.dsa_topk and the Triton kernels (mla_absorb/unfold, kv and indexer-plane appends, "
    "dsa_indexer_scores, dsa_attn: one launch per call, torch references inside); the generator object and jobs; "
    "the MTP round, MLAttention.decode_flash_attn/_attend, the indexer's selection loop, mtp_extend_selection and "
    "CacheLayer_MLA_fp16 are the wheel's"
)
NOT_COUNTED = {
    "collectives": "no tensor-parallel path runs on CPU",
    "cache-hits": "no engine cache entry point is wrapped by the census",
    "peak-memory": "the caches are allocated before the rounds",
}


def mtp_round(
    request: Any, *, census_cls: Any, dev_cls: Any, environ: Any, skip: tuple[str, ...]
) -> dict[str, Any]:
    """The census record of ``steps`` MTP draft rounds (see the module docstring); ``environ``: the os.environ class
    that records the EXL3_OVL_* switches the engine reads."""
    if request["scenario"] != SCENARIO:
        raise SystemExit(
            f"exllamav3 census: drafter 'mtp' runs scenario draft-round only (got {request['scenario']!r})"
        )
    if request.get("options"):
        raise SystemExit(
            f"exllamav3 census: the MTP round runs no model_init option (got {sorted(request['options'])})"
        )
    if request.get("ring_bits") is not None:
        raise SystemExit("exllamav3 census: ring_bits is for the DFlash ring drafter, not drafter 'mtp'")
    steps, bsz = int(request["steps"]), int(request.get("bsz", 2))
    depths, context = int(request.get("depths", 4)), int(request.get("context", 1000))
    graphed = bool(request.get("bc_mla", False))
    room = PAGES_PER_ROW * 256 - depths * (steps + WARMUP) - 1
    if not (1 <= steps <= 32 and 1 <= bsz <= 4 and 2 <= depths <= 8 and INDEX_TOPK < context <= room):
        raise SystemExit(
            f"exllamav3 census: drafter 'mtp': steps {steps} / bsz {bsz} / depths {depths} / context {context}; "
            f"expected 1..32 / 1..4 / 2..8 / {INDEX_TOPK + 1}..{room} (sparse past index_topk {INDEX_TOPK})"
        )

    import torch
    from exllamav3.cache.mla import CacheLayer_MLA_fp16
    from exllamav3.generator import generator as gen_mod
    from exllamav3.modules import mla_attn
    from exllamav3.modules.attention_fn import dsa_triton, mla_triton
    from exllamav3.modules.mla_attn import MLAttention

    c = census_cls(placement="is_cuda", device_class=dev_cls, skip=skip)
    dev = torch.device("cpu", 0)
    g = torch.Generator().manual_seed(5)

    def on_dev(t: Any) -> Any:
        return t.as_subclass(dev_cls)

    def weight(n_out: int, n_in: int) -> Any:
        return on_dev((torch.randn((n_out, n_in), generator=g) * n_in**-0.5).half())

    class Proj:
        """A projection as one fp16 matmul (the census counts it and its operand bytes)."""

        def __init__(self, n_in: int, n_out: int) -> None:
            self.w = weight(n_out, n_in)

        def forward(self, x: Any, params: Any, out_dtype: Any = None) -> Any:
            return x.half() @ self.w.t()  # (F.linear on a 3-D input reaches no aten op the census sees)

    class Norm:
        def __init__(self, name: str) -> None:
            self.name = name

        def forward(self, x: Any, params: Any, out_dtype: Any = None) -> Any:
            with c.kernel(self.name):
                return x.to(out_dtype or x.dtype) * 1

    def kernel(name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            with c.kernel(name):
                return fn(*args, **kwargs)

        return run

    def absorb(q: Any, w_uk_flat: Any, n_heads: int, nope: int) -> Any:
        return (
            torch.zeros((n_heads, q.shape[0], KV_LORA), dtype=torch.half, device=q.device) + q[:, :, :1].sum()
        )

    def unfold(o_lat: Any, w_uv_flat: Any, v_dim: int) -> Any:
        return torch.zeros((o_lat.shape[1], o_lat.shape[0] * v_dim), dtype=torch.half, device=o_lat.device)

    def kv_append(ckv: Any, kpe: Any, ckv_cache: Any, kpe_cache: Any, block_table: Any, seqlens: Any) -> None:
        return None

    def plane_append(k: Any, plane: Any, block_table: Any, seqlens: Any) -> None:
        # the new indexer keys land at each row's position (through its block table), as the kernel writes them
        for b in range(k.shape[0]):
            pos = int(seqlens[b])
            plane[int(block_table[b, pos // 256]), pos % 256] = k[b, 0, : plane.shape[-1]]

    def scores(q: Any, w: Any, keys: Any, q_pos0: int, compress: int, t_len: int, **kw: Any) -> Any:
        # operands the scoring kernel reads: the rows' indexer queries, head weights and t_len keys of the plane
        c.count("gemm-bytes", (q.numel() + w.numel() + t_len * IDX_DIM) * 2, kind="kernel:dsa_indexer_scores")
        with c.kernel("dsa_triton.dsa_indexer_scores"):
            bt, epp = kw["block_table"], kw["epp"]
            pos = torch.arange(t_len)
            rows = bt[pos // epp].long() * epp + pos % epp
            k = keys.view(-1, IDX_DIM)[rows].float()
            sc = torch.einsum("rhd,td->rht", q.float(), k).relu()
            sc = torch.einsum("rh,rht->rt", w.float(), sc)
            out = kw["scores"]
            out[:, :t_len] = sc.half()
            return out

    def dsa_topk(sc: Any, out: Any, k: int, *rest: Any) -> None:
        with c.kernel("exllamav3_ext.dsa_topk"):
            out.fill_(-1)
            out[:, :k] = sc[:, : max(k, 1)].float().topk(k, dim=1).indices.int()

    def ext_rope(*args: Any, **kwargs: Any) -> None:
        with c.kernel("exllamav3_ext.rope"):
            return None

    def dsa_attn(q_lat: Any, *args: Any, **kwargs: Any) -> Any:
        return torch.zeros_like(q_lat)

    m = MLAttention.__new__(MLAttention)
    for k, v in {
        "has_split_cache": False,
        "device": dev,
        "layer_idx": LAYER_IDX,
        "num_q_heads": HEADS,
        "hidden_size": HIDDEN,
        "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE,
        "qk_head_dim": NOPE + ROPE,
        "kv_lora_rank": KV_LORA,
        "v_head_dim": V_DIM,
        "q_lora_rank": Q_LORA,
        "l4_beta": 0.0,
        "norm_eps": 1e-6,
        "sm_scale": 1.0,
        "head_gate": None,
        "tp_reduce": False,
        "out_dtype": torch.half,
        "dispatch_cache": {},
        "indexer_mode": "full",
        "index_topk": INDEX_TOPK,
        "index_kpool": 0,
        "index_kpool_tail": False,
        "idx_plane_dim": IDX_DIM,
        "index_n_heads": IDX_HEADS,
        "index_head_dim": IDX_DIM,
        "q_proj": None,
        "q_a_proj": Proj(HIDDEN, Q_LORA),
        "q_a_layernorm": Norm("q_a_layernorm"),
        "q_b_proj": Proj(Q_LORA, HEADS * (NOPE + ROPE)),
        "kv_a_proj_with_mqa": Proj(HIDDEN, KV_LORA + ROPE),
        "kv_a_layernorm": Norm("kv_a_layernorm"),
        "o_proj": Proj(HEADS * V_DIM, HIDDEN),
        "idx_wq_b": Proj(Q_LORA, IDX_HEADS * IDX_DIM),
        "idx_wk": Proj(HIDDEN, IDX_DIM),
        "idx_k_norm": Norm("idx_k_norm"),
        "idx_weights": Proj(HIDDEN, IDX_HEADS),
        "w_uk_flat": weight(HEADS * NOPE, KV_LORA),
        "w_uv_flat": weight(HEADS * V_DIM, KV_LORA),
        "rope": SimpleNamespace(
            apply=kernel("rope.apply", lambda q, k, *a: (q, k)),
            inv_freq=on_dev(torch.ones(ROPE // 2)),
            rope_settings=SimpleNamespace(rope_style=2, rotate_dims=ROPE),
            attn_factor=1.0,
            llama_4_scaling_beta=0.0,
            llama_4_scaling_original=0,
        ),
    }.items():
        setattr(m, k, v)
    layer = CacheLayer_MLA_fp16(None, m, 0, 4 * PAGES_PER_ROW * 256)
    layer.alloc(dev)
    layer.k, layer.v, layer.k_idx = (
        on_dev(layer.k),
        on_dev(layer.v),
        on_dev(torch.randn(layer.shape_i, generator=g).half()),
    )

    replays = [0]

    def bc_graph(self: Any, x: Any, params: Any, lyr: Any, block_table: Any, cache_seqlens: Any) -> Any:
        """One replay of the BC decode graph (stand-in): its selection lands in a static, as bcm.step leaves it."""
        host = mla_attn._host_seqlens(params, cache_seqlens)
        c.count("graph-launches", kind="BC_MLAttention.run (one CUDA graph replay)")
        replays[0] += 1
        if max(host) + x.shape[1] > self.index_topk:
            params["dsa_topk_indices"] = static
        return torch.zeros((x.shape[0], x.shape[1], HIDDEN), dtype=torch.half, device=x.device)

    static = on_dev(torch.arange(INDEX_TOPK, dtype=torch.int32).repeat(bsz, 1))
    per_depth: dict[int, list[int]] = {}

    class Head:
        caps: ClassVar[dict[str, Any]] = {
            "mtp_draft": True,
            "default_draft_size": depths,
            "mtp_index_share": True,  # GLM-5.2's index_share_for_mtp_iteration (0019's models read it into caps)
        }

        def forward(self, input_ids: Any, params: Any) -> Any:
            before = c.current.counts["eager-launches"]
            with c.kernel("mtp head: embedding + enorm/hnorm + eh_proj (stand-in)"):
                x = (params["target_hidden"][:, :1, :HIDDEN].float() + input_ids.view(-1, 1, 1)).half()
            x = m.forward(x, params)
            with c.kernel("mtp head: MoE block + shared head (stand-in)"):
                state = x[:, :, :1].float().expand(-1, -1, VOCAB) + 0
            per_depth.setdefault(params["draft_step"], []).append(c.current.counts["eager-launches"] - before)
            return state

        def sample_from_state(self, state: Any, params: Any) -> Any:
            with c.kernel("mtp head: argmax (stand-in)"):
                return (state[:, :, 0].long() * 7 + params["draft_step"] + 3) % VOCAB

    staging: dict[tuple[str, int | None], Any] = {}

    def _staging(name: str, rows: int, width: int | None = None, dtype: Any = torch.int32) -> Any:
        key = (name, width)
        if key not in staging:
            shape = (8,) if width is None else (8, width)
            staging[key] = torch.zeros(shape, dtype=dtype, pin_memory=True)
        return c.mark_host(staging[key][:rows], pinned=True)  # a view of pinned memory is pinned

    positions = [context + 37 * b for b in range(bsz)]

    def job(i: int) -> Any:
        seq = SimpleNamespace(
            block_index_tensor=torch.arange(
                i * PAGES_PER_ROW, (i + 1) * PAGES_PER_ROW, dtype=torch.int32
            ).view(1, -1),
            kv_position=positions[i],
        )
        return SimpleNamespace(
            is_prefill_done=lambda: True,
            get_max_seq_len=lambda: seq.kv_position + 1,
            sequences=[seq],
            time_first_token=1.0,
            get_input_ids_list=lambda: [torch.tensor([[5 + i]])],
            mtp_last_hidden=on_dev(torch.zeros((1, 1, HIDDEN), dtype=torch.half)),
        )

    jobs = [job(i) for i in range(bsz)]
    fake = SimpleNamespace(
        active_jobs=jobs,
        _staging=_staging,
        draft_model=Head(),
        draft_cache=SimpleNamespace(layers={(LAYER_IDX, 0): layer}),
        cache="target cache",
        draft_calibrator=None,
        _sparse_flag=None,
        target_recurrent=False,
        hybrid_draft_tokens=0,
        model=SimpleNamespace(
            modules=[SimpleNamespace(device=dev), SimpleNamespace(prepare_for_device=lambda x, params: x)],
            logit_layer_idx=1,
        ),
        draft_input_ids_pinned=torch.zeros((8, 1), dtype=torch.long, pin_memory=False),
        draft_ids_pinned=torch.zeros((8, 16), dtype=torch.long, pin_memory=False),
    )
    saved = {
        (mla_attn, "mla_absorb"): mla_attn.mla_absorb,
        (mla_attn, "mla_unfold"): mla_attn.mla_unfold,
        (mla_attn, "_bc_mla_enable"): mla_attn._bc_mla_enable,
        (mla_triton, "mla_kv_append"): mla_triton.mla_kv_append,
        (mla_triton, "mla_plane_append"): mla_triton.mla_plane_append,
        (dsa_triton, "dsa_indexer_scores"): dsa_triton.dsa_indexer_scores,
        (dsa_triton, "dsa_attn"): dsa_triton.dsa_attn,
        (MLAttention, "bc_mla_step"): MLAttention.bc_mla_step,
    }
    import overlay_exl3_standin  # type: ignore[import-not-found]  # the stand-in extension (support/testbackends)

    prior = {n: overlay_exl3_standin.REFERENCES.get(n) for n in ("rope", "dsa_topk")}

    drafts: list[Any] = []
    plain_environ = os.environ.__class__
    os.environ.__class__ = environ
    try:
        mla_attn.mla_absorb = kernel("mla_triton.mla_absorb", absorb)
        mla_attn.mla_unfold = kernel("mla_triton.mla_unfold", unfold)
        mla_triton.mla_kv_append = kernel("mla_triton.mla_kv_append", kv_append)
        mla_triton.mla_plane_append = kernel("mla_triton.mla_plane_append", plane_append)
        dsa_triton.dsa_indexer_scores = scores
        dsa_triton.dsa_attn = kernel("dsa_triton.dsa_attn", dsa_attn)
        overlay_exl3_standin.REFERENCES.update({"rope": ext_rope, "dsa_topk": dsa_topk})
        if graphed:
            MLAttention.bc_mla_step = bc_graph
        else:
            mla_attn._bc_mla_enable = False  # EXL3_BC_MLA=0: the dispatch path (where the BC graph declines)
        with c:
            fake.draft_input_ids_pinned = torch.zeros((8, 1), dtype=torch.long, pin_memory=True)
            fake.draft_ids_pinned = torch.zeros((8, 16), dtype=torch.long, pin_memory=True)
            for _ in range(steps + WARMUP):
                with c.step(TAG):
                    out = gen_mod.Generator.iterate_draftmodel_mtp_gen(fake, [], depths)
                drafts.append(out[:bsz].tolist())
                for j in jobs:  # the verify accepted the whole window: the next round starts past it
                    j.sequences[0].kv_position += depths
    finally:
        os.environ.__class__ = plain_environ
        for (owner, name), value in saved.items():
            setattr(owner, name, value)
        for name, ref in prior.items():
            if ref is None:
                overlay_exl3_standin.REFERENCES.pop(name, None)
            else:
                overlay_exl3_standin.REFERENCES[name] = ref
    report = c.report(tag=TAG, skip=WARMUP)
    metrics = dict(report["metrics"])
    for metric in NOT_COUNTED:
        metrics[metric] = None
    counted = {d: v[WARMUP:] for d, v in sorted(per_depth.items())}
    depth_means = {str(d): sum(v) / len(v) for d, v in counted.items() if v}
    kinds = report.get("kinds") or {}
    notes = [
        (
            f"MTP drafter: bsz {bsz}, {depths} draft depths per round, K/V positions {positions} (> index_topk "
            f"{INDEX_TOPK}: sparse), one DSA full-indexer MLA layer (GLM-5.2 MTP attention); {report['steps']} "
            f"rounds after {WARMUP} warm-up"
        ),
        (
            "BC decode graph: "
            + (
                "one stand-in replay per call (graph-launches), as a supported EXL3 layer takes by default"
                if graphed
                else "off (mla_attn._bc_mla_enable False, as EXL3_BC_MLA=0): every depth on the dispatch path"
            )
        ),
        "eager launches of the head's forward per depth: "
        + ", ".join(f"d{d} {v:g}" for d, v in depth_means.items()),
    ]
    flagged, metrics = judged_flags(
        FLAG_PREFIX, environ.read, "on this scenario's CPU path (the MTP round)", metrics
    )
    notes += flagged
    notes += [f"{m_}: not counted ({why})" for m_, why in NOT_COUNTED.items()]
    detail = {
        "per_depth_eager_launches": depth_means,
        "drafts": drafts[WARMUP:],
        "graph_replays": replays[0],
        "bc_mla": graphed,
        "kinds": dict(kinds),
        "violations": report["violations"][:5],
    }
    return census_record(SCENARIO, report, metrics, notes, standin=STANDIN, detail=detail, steps=steps)
