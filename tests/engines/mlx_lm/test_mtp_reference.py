"""The patched MTP head against the reference head of the tiny models (patch mtp-modules).

``qwen3_5-mtp`` (overlay.check.models) has an MTP head trained against its frozen target with the reference MLX module
``overlay/tinymodels/mlx_mtp.py`` (docs/models.md). The patched mlx-lm, loading the same checkpoint with keep_mtp,
must compute the same MTP logits (fp32), and greedy decoding with its drafts must equal stock serial decoding while
accepting drafts (probes/mtp_reference.py). Slow: building qwen3_5-mtp trains two models (cached under build/models).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check import models as tinymodels
from overlay.check.envs import Arms

PROBE = Path(__file__).parent / "probes" / "mtp_reference.py"
MAX_TOKENS = 48
K = (1, 3)
MIN_ACCEPTANCE = 0.3  # measured on these 6 prompts: 114/170 (k=1), 155/384 (k=3); a random head accepts ~0

pytestmark = pytest.mark.long  # the reference run: ~3 minutes on 2 cores; scripts/test_long.sh


@pytest.fixture(scope="module")
def reference(arms: Arms, repo_root: Path) -> dict[str, Any]:
    model = tinymodels.build("qwen3_5-mtp", root=repo_root, python=arms.stock.python)
    prompts = [p for category in ("prose", "code", "repetitive") for p in tinymodels.PROMPTS[category][:2]]
    payload = {
        "model": str(model),
        "reference": str(Path(tinymodels.__file__).parent),
        "prompts": prompts,
        "max_tokens": MAX_TOKENS,
        "k": list(K),
    }
    result: dict[str, Any] = arms.patched.run_json(PROBE, payload)
    return result


@pytest.mark.slow
def test_mtp_logits_match_reference_head(reference: dict[str, Any]) -> None:
    # Same modules, same ops: bit-identical (fp32 rounding would allow ~1e-5; none is seen).
    assert max(reference["logits_max_abs"]) == 0.0
    assert max(reference["hidden_max_abs"]) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("k", K)
def test_mtp_greedy_self_check(k: int, reference: dict[str, Any]) -> None:
    spec = reference["spec"][str(k)]
    assert spec["tokens"] == reference["serial"], "greedy output must equal stock serial decoding"
    assert spec["reference_tokens"] == reference["serial"]
    rate = spec["accepted"] / spec["drafted"]
    assert rate > MIN_ACCEPTANCE
    # The patched head (with its KV cache) drafts what the reference head (recomputed each cycle) drafts;
    # measured: the same counts. Cached attention may round differently (~1e-7), hence a margin.
    assert abs(rate - spec["reference_accepted"] / spec["reference_drafted"]) <= 0.05
