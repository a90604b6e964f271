# mypy: disable-error-code="import-not-found", allow-subclassing-any
"""Reference MLX implementation of the Qwen3.5 / Qwen3-Next MTP head of the tiny models (spec: docs/models.md).

Standalone on purpose: it imports only mlx, mlx_lm and the standard library, so it runs in any interpreter that has
mlx-lm (a stock arm, a scratch venv) without overlay installed. ``_mlx_tasks.py`` trains the head with it; checks
and patch tests may use :func:`speculative_greedy` as the reference for acceptance.

One MTP step at position t (t = the position of the target hidden state):

    e   = embed_tokens(token[t + 1])                     # the target's embedding table (shared)
    h   = hidden[t]                                      # target hidden state AFTER the final norm
    x   = fc(concat([pre_fc_norm_embedding(e), pre_fc_norm_hidden(h)]))     # embedding first
    x   = layers[0](x, causal mask, its own KV cache at RoPE offset t)      # one full-attention decoder layer
    g   = norm(x)                                        # mtp.norm; g is both the draft hidden and the next h
    p   = lm_head(g)                                     # the target's lm_head -> draft of token[t + 2]

Every RMSNorm of the block is stored zero-centred (effective weight = 1 + stored), the Qwen3-Next convention;
:func:`mtp_weights` converts a checkpoint's ``mtp.*`` tensors into effective weights.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx import nn
from mlx_lm.models import qwen3_5
from mlx_lm.models.base import create_attention_mask

ZERO_CENTRED_NAMES = ("norm.weight", "pre_fc_norm_hidden.weight", "pre_fc_norm_embedding.weight")
ZERO_CENTRED_SUFFIXES = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def text_model(model: Any) -> Any:
    """The ``qwen3_5.TextModel`` inside a loaded ``qwen3_5.Model`` (or the model itself)."""
    return getattr(model, "language_model", model)


class MTPHead(nn.Module):
    """Qwen3-Next style multi-token-prediction block (parameter names = checkpoint names without ``mtp.``)."""

    def __init__(self, args: Any, num_layers: int = 1) -> None:
        super().__init__()
        h, eps = args.hidden_size, args.rms_norm_eps
        self.pre_fc_norm_embedding = nn.RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        full_attention_index = args.full_attention_interval - 1  # a layer index whose type is full attention
        self.layers = [qwen3_5.DecoderLayer(args, layer_idx=full_attention_index) for _ in range(num_layers)]
        self.norm = nn.RMSNorm(h, eps=eps)

    def __call__(self, hidden: mx.array, embeds: mx.array, cache: Any = None, step: int = 0) -> mx.array:
        """``hidden``: target (or previous MTP) hidden states ``(B, L, H)``; ``embeds``: embeddings of the next
        tokens ``(B, L, H)``. Returns the normed MTP hidden states ``(B, L, H)``."""
        x = mx.concatenate([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], axis=-1)
        x = self.fc(x)
        mask = create_attention_mask(x, cache)
        x = self.layers[step % len(self.layers)](x, mask, cache)
        return self.norm(x)


def hf_layout(raw: dict[str, mx.array]) -> bool:
    """Whether a checkpoint is in the HF layout (conv1d ``(C, 1, K)``): then Qwen norms are stored zero-centred.

    The same test stock mlx-lm's ``qwen3_5.TextModel.sanitize`` uses before adding 1 to the main model's norms.
    """
    return any("conv1d.weight" in k and v.shape[-1] != 1 for k, v in raw.items())


def mtp_weights(raw: dict[str, mx.array]) -> list[tuple[str, mx.array]]:
    """``mtp.*`` checkpoint tensors -> (name, effective weight) pairs for :class:`MTPHead`.``load_weights``."""
    shift = hf_layout(raw)
    out = []
    for key, value in raw.items():
        if not key.startswith("mtp."):
            continue
        name = key[len("mtp.") :]
        if shift and (name in ZERO_CENTRED_NAMES or name.endswith(ZERO_CENTRED_SUFFIXES)):
            value = value + 1.0
        out.append((name, value))
    return out


def load_head(model: Any, checkpoint: str, config: dict[str, Any]) -> MTPHead:
    """Build the MTP head of a loaded tiny Qwen3.5 target from the ``mtp.*`` tensors of its checkpoint file."""
    text_config = config.get("text_config", config)
    head = MTPHead(text_model(model).args, num_layers=int(text_config.get("mtp_num_hidden_layers", 1)))
    weights = mtp_weights(mx.load(checkpoint))
    if not weights:
        raise ValueError(f"{checkpoint} holds no mtp.* tensors")
    head.load_weights(weights, strict=True)
    mx.eval(head.parameters())
    return head


def embed(model: Any, tokens: mx.array) -> mx.array:
    return text_model(model).model.embed_tokens(tokens)


def lm_head(model: Any, hidden: mx.array) -> mx.array:
    tm = text_model(model)
    if tm.args.tie_word_embeddings:
        return tm.model.embed_tokens.as_linear(hidden)
    return tm.lm_head(hidden)


def target_forward(model: Any, tokens: mx.array) -> tuple[mx.array, mx.array]:
    """Target hidden states after the final norm, and logits, for ``tokens`` ``(B, L)`` (no cache)."""
    hidden = text_model(model).model(tokens)
    return hidden, lm_head(model, hidden)


def speculative_greedy(
    model: Any, head: MTPHead, prompt: list[int], *, max_tokens: int, k: int
) -> dict[str, Any]:
    """Greedy decoding with ``k`` chained MTP drafts per cycle, recomputing everything without caches.

    Slow on purpose (obviously correct): each cycle runs the target once over the whole sequence plus drafts, and
    the MTP head over all known (hidden, next token) pairs. Returns the tokens and acceptance counters; the tokens
    equal serial greedy decoding up to float ties (the target sees the same prefixes).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    seq = list(prompt)
    hidden, logits = target_forward(model, mx.array([seq]))
    y = int(mx.argmax(logits[0, -1]).item())
    out = [y]
    cycles = drafted = accepted = 0
    per_position = [0] * k
    while len(out) < max_tokens:
        n = len(seq)
        kk = min(k, max_tokens - len(out))
        next_tokens = mx.array([seq[1:] + [y]])
        h = hidden[:, :n]
        drafts: list[int] = []
        for _ in range(kk):
            g = head(h, embed(model, next_tokens))
            d = int(mx.argmax(lm_head(model, g[:, -1:])[0, -1]).item())
            drafts.append(d)
            h = mx.concatenate([h, g[:, -1:]], axis=1)  # chain: the MTP hidden state feeds the next step
            next_tokens = mx.concatenate([next_tokens, mx.array([[d]])], axis=1)
        hidden, logits = target_forward(model, mx.array([seq + [y] + drafts]))
        verify = [int(t) for t in mx.argmax(logits[0, n:], axis=-1).tolist()]
        m = 0
        while m < kk and verify[m] == drafts[m]:
            per_position[m] += 1
            m += 1
        cycles += 1
        drafted += kk
        accepted += m
        seq = seq + [y] + drafts[:m]
        y = verify[m]
        out.extend(drafts[:m])
        out.append(y)
    out = out[:max_tokens]
    return {
        "tokens": out,
        "cycles": cycles,
        "drafted": drafted,
        "accepted": accepted,
        "accepted_per_position": per_position,
    }


def serial_greedy(model: Any, prompt: list[int], *, max_tokens: int) -> list[int]:
    """Plain greedy decoding with stock ``mlx_lm.generate.generate_step`` (the reference output)."""
    import importlib

    generate = importlib.import_module("mlx_lm.generate")
    tokens = []
    for token, _ in generate.generate_step(
        mx.array(prompt), model, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, axis=-1)
    ):
        tokens.append(int(token))
    return tokens
