"""The server batches every request that does not draft with the MTP head (patch generate: --draft-kind mtp).

Model: the tiny fp32 glm4_moe MTP checkpoint of probes/mtp_build.py (KV caches, so stock batches it). Probe:
probes/server_batching.py runs the server's own ``main`` argument parsing and ``ModelProvider`` load, asks
``ResponseGenerator._is_batchable`` about a request of each draft kind, and runs ``batch_generate`` on the loaded
model. Before the fix, loading MTP weights at all (``--draft-kind mtp``, or just ``MLX_LM_KEEP_MTP=1``, which the docs
call safe for every model) turned continuous batching off for every request. Now only requests that draft with the
head go one at a time, and batched generation on a model with its head attached gives stock's text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arms

PROBES = Path(__file__).parent / "probes"
PROMPTS = ["<5> <9> <13>", "<7> <8> <20> <21> <22>", "<3>"]


@pytest.fixture(scope="module")
def glm(arms: Arms, repo_root: Path) -> str:
    built: dict[str, Any] = arms.stock.run_json(
        PROBES / "mtp_build.py", {"out": str(repo_root / "build" / "models")}
    )
    return str(built["models"]["glm4_moe"]["dir"])


def test_mtp_weights_keep_continuous_batching(arms: Arms, glm: str) -> None:
    base = {"model": glm, "prompts": PROMPTS, "max_tokens": 8}
    stock = arms.stock.run_json(PROBES / "server_batching.py", base)
    assert stock["provider_batchable"] and not stock["has_mtp"]
    for setup in ({"env": {"MLX_LM_KEEP_MTP": "1"}}, {"args": ["--draft-kind", "mtp"]}):
        patched = arms.patched.run_json(PROBES / "server_batching.py", {**base, **setup})
        assert patched["has_mtp"], setup
        assert patched["provider_batchable"], f"{setup}: loading MTP weights turned batching off"
        assert patched["batchable"] == {"model": True, "mtp": False}, setup
        assert patched["batch_texts"] == stock["batch_texts"], setup
