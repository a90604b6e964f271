"""The shared byte-level BPE tokenizer of every tiny model (vocabulary 512, trained locally with ``tokenizers``).

All kinds share one tokenizer (a drafter and its target must agree on token ids), trained on
:func:`overlay.check.models.corpus.tokenizer_corpus`. Ids 0, 1, 2 are ``<s>``, ``</s>``, ``<pad>``; encoding adds
``<s>`` in front (``TemplateProcessing``), like Llama tokenizers do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from overlay.check.models.corpus import tokenizer_corpus

VOCAB_SIZE: Final = 512
BOS: Final = "<s>"
EOS: Final = "</s>"
PAD: Final = "<pad>"
BOS_ID: Final = 0
EOS_ID: Final = 1
PAD_ID: Final = 2
TOKENIZER_VERSION: Final = 1
MODEL_MAX_LENGTH: Final = 2048


def train_tokenizer() -> Any:
    """Train the tokenizer; returns a ``tokenizers.Tokenizer``. Deterministic (same corpus, same merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(
            f"tokenizer training gave {tokenizer.get_vocab_size()} tokens, expected {VOCAB_SIZE}"
        )
    if [tokenizer.token_to_id(t) for t in (BOS, EOS, PAD)] != [BOS_ID, EOS_ID, PAD_ID]:
        raise RuntimeError("tokenizer training did not put <s>, </s>, <pad> at ids 0, 1, 2")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    return tokenizer


def tokenizer_config() -> dict[str, Any]:
    """``tokenizer_config.json`` for transformers' ``PreTrainedTokenizerFast`` (no chat template on purpose)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "left",
    }


def write_tokenizer(directory: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``."""
    tokenizer = train_tokenizer()
    text = tokenizer.to_str(pretty=True)
    (directory / "tokenizer.json").write_text(text + "\n", encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def load_tokenizer(directory: Path) -> Any:
    """The ``tokenizers.Tokenizer`` of a built model directory."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(directory / "tokenizer.json"))
