"""``mlx_lm.generate --prompt-cache-file`` with a drafter (patch generate: --draft-kind mtp).

A prompt cache saved by ``mlx_lm.cache_prompt`` holds the target's layers only. ``speculative_generate_step`` took
the drafter's cache from the layers after the target's, found none, and raised IndexError for ``--draft-kind mtp``
and, in stock already, for ``--draft-model``. Now the drafter starts a cache of its own from the new tokens (lossless:
the verify decides every token). Reference: stock ``mlx_lm.generate`` without a drafter, from the same cache file.
Models: the qwen3_next MTP checkpoint (hybrid) and the qwen3 target + noisy drafter of the speculative tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_spec_mtp import families, text_model  # noqa: F401 - fixtures

from overlay.check.envs import Arms

CACHED = "<5> <9> <13> <17> <21> <25>"
PROMPT = "<29> <33>"


def _cached_text(arm: Any, model: str, cache: Path, *extra: str) -> str:
    proc = arm.run(
        [
            "-m",
            "mlx_lm",
            "generate",
            "--model",
            model,
            "--prompt-cache-file",
            str(cache),
            "--prompt",
            PROMPT,
            "--max-tokens",
            "24",
            "--temp",
            "0",
            "--ignore-chat-template",
            *extra,
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text: str = proc.stdout.split("==========")[1].strip()
    return text


def _cache_prompt(arms: Arms, model: str, out: Path) -> Path:
    proc = arms.stock.run(
        [
            "-m",
            "mlx_lm",
            "cache_prompt",
            "--model",
            model,
            "--prompt",
            CACHED,
            "--prompt-cache-file",
            str(out),
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_prompt_cache_file_with_mtp(arms: Arms, text_model: str, tmp_path: Path) -> None:  # noqa: F811
    cache = _cache_prompt(arms, text_model, tmp_path / "mtp.safetensors")
    ref = _cached_text(arms.stock, text_model, cache)
    assert ref
    assert (
        _cached_text(arms.patched, text_model, cache, "--draft-kind", "mtp", "--num-draft-tokens", "2") == ref
    )


def test_prompt_cache_file_with_draft_model(arms: Arms, models: dict[str, str], tmp_path: Path) -> None:
    cache = _cache_prompt(arms, models["qwen3"], tmp_path / "llm.safetensors")
    ref = _cached_text(arms.stock, models["qwen3"], cache)
    assert _cached_text(arms.patched, models["qwen3"], cache, "--draft-model", models["qwen3-noisy"]) == ref
