"""Chained DeepSeek-V3 / GLM nextn drafts use the normalised hidden state (patch models: attach MTP head modules).

The head handed the pre-norm output of its block to the next chained draft, while the target hands it the
post-final-norm state (SGLang, current vLLM and GLM chain the normalised one). probes/nextn_reference.py writes the
MTP step from the DeepSeek-V3 report's equations with explicit RMSNorm and matmuls from the checkpoint's weights
(the transformer block called as a black box), independently of the patch, and compares the patched
``mtp_forward`` at depth 1 and at chained depth 2. Models: the five nextn families of probes/mtp_build.py (tiny fp32,
fixed-seed random weights). The pre-norm chain differs from the reference by 0.06-0.11 in the depth-2 logits, so
the test separates the two conventions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arms

PROBES = Path(__file__).parent / "probes"
NEXTN = ("deepseek_v3", "deepseek_v32", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa")
TOL = 1e-5


@pytest.fixture(scope="module")
def families(arms: Arms, repo_root: Path) -> dict[str, Any]:
    built: dict[str, Any] = arms.stock.run_json(
        PROBES / "mtp_build.py", {"out": str(repo_root / "build" / "models")}
    )
    models: dict[str, Any] = built["models"]
    return models


def test_nextn_chain_matches_the_published_definition(arms: Arms, families: dict[str, Any]) -> None:
    for fam in NEXTN:
        res = arms.patched.run_json(
            PROBES / "nextn_reference.py",
            {"model": families[fam]["dir"], "prompt": [5, 9, 13, 17], "drafts": [21, 40]},
        )
        assert res["ref_gap"] > 1e-2, f"{fam}: the two conventions must differ for the test to mean anything"
        assert res["depth1_max_abs"] <= TOL, (fam, res)
        assert res["depth2_max_abs"] <= TOL, f"{fam}: chained draft differs from the reference: {res}"
        assert res["hidden_is_normed"] <= TOL, (fam, res)
