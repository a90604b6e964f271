"""The server's prompt cache after a speculative generation holds every emitted token (stock bug, fixed by the
patch generate: a closed speculative generation leaves every emitted token in the prompt cache).

When a speculative generation stops on the verify's own token (not a draft), the target has not processed that
token yet, but ``mlx_lm.server`` stores the cache under ``prompt + every emitted token``; the next turn of the
conversation reuses it and never feeds that token (positions shift by one). Probe: probes/spec_server.py (a real
``mlx_lm.server`` on a local port). Model: the tiny fp32 ``qwen3`` of the speculative tests, drafting for itself
(k = 3 at temp 0: every draft is accepted, so a 4-token completion ends on the verify's own token). Turn 2 extends
turn 1's prompt + completion; the reference is stock ``mlx_lm.generate`` on turn 2's prompt from scratch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlay.check.envs import Arms

SERVER = Path(__file__).parent / "probes" / "spec_server.py"
TURN1 = "<5> <9> <13> <17> <21>"


def _cli(arm: Any, model: str, prompt: str, tokens: int) -> str:
    proc = arm.run(
        [
            "-m",
            "mlx_lm",
            "generate",
            "--model",
            model,
            "--prompt",
            prompt,
            "--max-tokens",
            str(tokens),
            "--temp",
            "0",
            "--ignore-chat-template",
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text: str = proc.stdout.split("==========")[1].strip()
    return text


def test_second_turn_reuses_a_complete_cache(arms: Arms, models: dict[str, str]) -> None:
    model = models["qwen3"]
    first = _cli(arms.stock, model, TURN1, 4)
    turn2 = f"{TURN1} {first} <7> <8>"
    ref = _cli(arms.stock, model, turn2, 12)
    result = arms.patched.run_json(
        SERVER,
        {
            "args": ["--model", model, "--draft-model", model, "--num-draft-tokens", "3"],
            "requests": [
                {"prompt": TURN1, "max_tokens": 4, "temperature": 0},
                {"prompt": turn2, "max_tokens": 12, "temperature": 0},
            ],
        },
        timeout=900,
    )
    one, two = (r["body"] for r in result["responses"])
    assert one["choices"][0]["text"].strip() == first
    spec = one["usage"]["speculative"]
    assert spec["accepted"] == 3 and spec["emitted"] == 4, "turn 1 must end on the verify's own token"
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == 9  # the prompt cache was reused
    assert two["choices"][0]["text"].strip() == ref
