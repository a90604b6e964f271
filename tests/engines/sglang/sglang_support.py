"""Helpers for the SGLang series tests (imported by the test modules; fixtures live in conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlay.check.envs import Arm, Arms

PROBES = Path(__file__).resolve().parent / "probes"
UNIT_CASES = [
    "pp_tail",
    "future_map_resolve",
    "graph_verify_epilogue",
    "packed_broadcast",
    "gumbel_topk_topp",
    "lm_head_quant_predicate",
    "fp8_lm_head",
    "fp8_lm_head_lifecycle",
    "splitk_fp8_gemm",
    "splitk_ue8m0_scales",
    "splitk_triton_interp",
    "splitk_launches",
    "fused_norm_quant",
    "cpu_sampling_verify",
    "accept_stats",
]
REPO = Path(__file__).resolve().parents[3]
RUN_ENGINE = REPO / "support" / "testbackends" / "sglang" / "run_engine.py"
_UNIT_CACHE: dict[Path, dict[str, Any]] = {}
_ENGINE_CACHE: dict[Path, dict[str, Any]] = {}


def tiny_model(kind: str = "llama-random") -> Path:
    """A tiny random HF llama (vocab 512), generated locally and cached under build/models."""
    from overlay.check.models import build

    return Path(build(kind, root=REPO))


def _unit_results(arm: Arm) -> dict[str, Any]:
    if arm.venv not in _UNIT_CACHE:
        _UNIT_CACHE[arm.venv] = arm.run_json(
            PROBES / "units.py",
            {"cases": UNIT_CASES},
            timeout=1200,
            extra_env={"OVERLAY_SGLANG_MODEL_DIR": str(tiny_model())},
        )["cases"]
    return _UNIT_CACHE[arm.venv]


class UnitCases:
    """Stock and patched results of the unit probe; ``case(name)`` fails on a probe error."""

    def __init__(self, arms: Arms) -> None:
        self.arms = arms

    def case(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        stock = _unit_results(self.arms.stock)[name]
        patched = _unit_results(self.arms.patched)[name]
        for arm, result in (("stock", stock), ("patched", patched)):
            assert "error" not in result, f"{name} failed in the {arm} arm:\n{result['error']}"
        return stock, patched


def assert_noop_and_exact(stock: dict[str, Any], patched: dict[str, Any]) -> None:
    """The stock path gives the same result in both arms, and the patched path equals it bit for bit."""
    assert patched["ref"] == stock["ref"], "flag off: the patched arm's stock path changed"
    assert stock["new"] is None, "the stock arm unexpectedly has the patched code path"
    assert patched["new"] is not None, "the patched arm lacks the patched code path"
    assert patched["new"] == stock["ref"], "flag on: outputs differ from stock (numerics class: exact)"


# --- engine runs ------------------------------------------------------------------------------------------------

PROMPTS = [[0, 5, 9, 17, 33, 40, 41], [0, 7, 7, 100, 200, 300]]
MAX_NEW_TOKENS = 24
SPEC = {"algorithm": "STANDALONE", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}
# Every exact/lossless flag of the series whose path the CPU engine reaches; stock ignores unknown variables.
EXACT_FLAGS = {"SGLANG_OPT_PACKED_VERIFY_BROADCAST": "1", "SGLANG_OPT_SPEC_ACCEPT_STATS": "1"}


def engine_payload(model: Path, *, patched_only: bool) -> dict[str, Any]:
    """The engine runs of one arm. Both arms run "plain" and "standalone" with the same inputs; the patched arm
    also runs "sampled", which only the patched wheel can do on a CPU (0009) and which exercises the approximate
    FP8 lm_head (0006) end to end."""
    spec = {**SPEC, "draft_model": str(model)}
    runs: list[dict[str, Any]] = [
        # greedy + one sampled request (fixed seed): identical between arms with the flags on
        {"name": "plain", "sampling": [{"temperature": 0.0}, {"temperature": 0.8}], "env": EXACT_FLAGS},
        {"name": "standalone", "spec": spec, "env": EXACT_FLAGS, "server_info": True},
    ]
    if patched_only:
        runs.append(
            {
                "name": "sampled",
                "spec": spec,
                "sampling": [
                    {"temperature": 0.0, "custom_params": {"workload": "code"}},
                    {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "custom_params": {"workload": "chat"}},
                ],
                "env": {
                    **EXACT_FLAGS,
                    "SGLANG_OPT_CPU_SAMPLING_VERIFY": "1",
                    "SGLANG_OPT_FP8_LM_HEAD": "1",
                    "SGLANG_OPT_GUMBEL_TOPK_TOPP_SAMPLE": "1",
                },
                "server_info": True,
            }
        )
    return {"model": str(model), "prompts": PROMPTS, "max_new_tokens": MAX_NEW_TOKENS, "runs": runs}


def engine_results(arms: Arms) -> tuple[dict[str, Any], dict[str, Any]]:
    """One run_engine.py process per arm (engine starts cost ~15-40 s each), cached for the session."""
    model = tiny_model()
    for arm, patched_only in ((arms.stock, False), (arms.patched, True)):
        if arm.venv not in _ENGINE_CACHE:
            _ENGINE_CACHE[arm.venv] = arm.run_json(
                RUN_ENGINE, engine_payload(model, patched_only=patched_only), timeout=1500
            )["runs"]
    return _ENGINE_CACHE[arms.stock.venv], _ENGINE_CACHE[arms.patched.venv]


def tokens(run: dict[str, Any]) -> list[list[int]]:
    return [o["output_ids"] for o in run["outputs"]]


def regime_stats(run: dict[str, Any]) -> list[dict[str, Any]]:
    states = run.get("internal_states") or []
    return [row for state in states for row in (state.get("spec_acceptance_by_regime") or [])]
