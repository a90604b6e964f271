"""Probe: chained DeepSeek-V3 / GLM nextn drafts against a reference written from the published definition.

Payload: {"model": folder (an MTP family checkpoint of mtp_build.py), "prompt": [ids], "drafts": [t1, t2]}.

Reference (DeepSeek-V3 technical report, section 2.2, "Multi-Token Prediction"), for MTP module k with input
representation h^{k-1} and the embedding of the next token:
    h'^k = M_k [RMSNorm(h^{k-1}); RMSNorm(Emb(t))]      (M_k: eh_proj; the two norms: hnorm, enorm)
    h^k  = TRM_k(h'^k)                                  (the module's transformer block, causal over its positions)
    P^k  = OutHead(h^k)                                 (shared output head: its RMSNorm, shared_head.norm, then
                                                         the shared lm_head)
The representation handed from one module to the next is the normalised one, as the main model hands its
post-final-norm hidden state to module 1: chained depth k+1 takes RMSNorm_shared_head(h^k) (SGLang deepseek_nextn,
vLLM after #45895 / #47448, GLM's NextN which normalises at the end of every step). The concatenation order follows
the published checkpoints' eh_proj layout, [enorm(embedding), hnorm(hidden)] (the report writes the pair the other
way round in its notation; vLLM and SGLang load the weights in this order). Written here with explicit RMSNorm and
matmuls from the weights; TRM_k is the checkpoint's decoder block called as a black box (no cache, causal over
[depth 1, depth 2]).

The patched model: ``mtp_forward`` at depth 1 from the target's last hidden state (``return_hidden``), then depth 2
from the head's returned hidden (what speculative decoding chains), both on one fresh MTP cache.
Result: {"depth1_max_abs", "depth2_max_abs", "depth2_prenorm_max_abs" (reference with the pre-norm chain),
"hidden_is_normed": max abs between the returned hidden and RMSNorm_shared_head(h^1)}.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from probe_io import emit, read_payload


def rms(x: mx.array, w: mx.array, eps: float) -> mx.array:
    x = x.astype(mx.float32)
    return x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps) * w


if __name__ == "__main__":
    payload = read_payload()
    from mlx_lm.models.base import create_attention_mask
    from mlx_lm.utils import load_model

    model, config = load_model(Path(payload["model"]), model_config={"keep_mtp": True})
    owner = model.language_model if "language_model" in model else model
    eps = float(config.get("rms_norm_eps", 1e-6))
    layer = owner.mtp.layers[0]
    emb = owner.model.embed_tokens.weight
    head = owner.lm_head.weight if "lm_head" in owner else emb
    t1, t2 = payload["drafts"]

    _, hidden = model(mx.array([payload["prompt"]]), return_hidden=True)
    h0 = hidden[:, -1:]

    def m_k(h: mx.array, t: int) -> mx.array:
        pair = mx.concatenate(
            [rms(emb[t][None, None], layer.enorm.weight, eps), rms(h, layer.hnorm.weight, eps)], axis=-1
        )
        return pair @ layer.eh_proj.weight.T

    def trm(xs: mx.array) -> mx.array:
        return layer.mtp_block(xs, create_attention_mask(xs, None, return_array=True), None)

    def out_head(h: mx.array) -> mx.array:
        return rms(h, layer.shared_head.norm.weight, eps) @ head.T

    x1 = m_k(h0, t1)
    y1 = trm(x1)
    ref1 = out_head(y1)
    normed1 = rms(y1, layer.shared_head.norm.weight, eps)
    ref2 = out_head(trm(mx.concatenate([x1, m_k(normed1, t2)], axis=1))[:, -1:])
    ref2_pre = out_head(trm(mx.concatenate([x1, m_k(y1, t2)], axis=1))[:, -1:])

    cache = model.make_mtp_cache()
    logits1, hid1 = model.mtp_forward(h0, mx.array([[t1]]), cache)
    logits2, _ = model.mtp_forward(hid1[:, -1:], mx.array([[t2]]), cache)

    def diff(a: mx.array, b: mx.array) -> float:
        return float(mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max())

    emit(
        {
            "depth1_max_abs": diff(logits1, ref1),
            "depth2_max_abs": diff(logits2, ref2),
            "depth2_prenorm_max_abs": diff(logits2, ref2_pre),
            "hidden_is_normed": diff(hid1, normed1),
            "ref_gap": diff(ref2, ref2_pre),
        }
    )
