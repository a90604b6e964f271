"""The SGLang census task (workers/sglang_worker.py task_census, counted in the scheduler process by
workers/sglang_census_hook.py) on the CPU engine path, stock arm: real engine, tiny random llama."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

import pytest

from overlay.check.envs import Arm, arms_for
from overlay.engines import get_adapter
from overlay.schemas.documents import CensusRequest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "engines" / "sglang"))
pytestmark = [pytest.mark.slow, pytest.mark.long]  # minutes on 2 cores: scripts/test_long.sh


@pytest.fixture(scope="module")
def stock() -> Arm:
    return arms_for(REPO, "sglang").stock


@pytest.fixture(scope="module")
def model() -> Path:
    from engines.sglang.sglang_support import tiny_model

    path: Path = tiny_model()
    return path


def census(
    arm: Arm,
    model: Path,
    scenario: str,
    env: dict[str, str] | None = None,
    *,
    algorithm: Literal["STANDALONE", "NEXTN"] | None = None,
    num_draft: int | None = None,
    attention_backend: Literal["intel_amx", "triton"] | None = None,
) -> dict[str, Any]:
    req: CensusRequest = {"task": "census", "model": str(model), "scenario": scenario, "steps": 3}
    if algorithm is not None:
        req["algorithm"] = algorithm
    if attention_backend is not None:
        req["attention_backend"] = attention_backend
    if num_draft is not None:
        req["num_draft"] = num_draft
    return get_adapter("sglang").run(arm.with_env(env), req)


def test_decode_step_counts_in_the_scheduler(stock: Arm, model: Path) -> None:
    doc = census(stock, model, "decode-step", {"SGLANG_OPT_NOT_A_SWITCH": "1"})
    assert doc["steps"] == 3
    # a switch the engine never reads: every metric is "not measured", never a silent "unchanged"
    assert set(doc["metrics"].values()) == {None}
    assert any("SGLANG_OPT_NOT_A_SWITCH set but never read" in n for n in doc["notes"])
    counted = doc["detail"]["uncounted"]
    assert counted["host-syncs"] >= 1 and counted["eager-launches"] > 10
    assert all(site.startswith("sglang/srt/") for site, _ in doc["sites"]["host-syncs"])
    assert doc["detail"]["per_step"][0]["host-syncs"] == doc["detail"]["per_step"][-1]["host-syncs"]


def test_fp8_lm_head_halves_the_heads_gemm_bytes_at_least(model: Path) -> None:
    """0006 (FP8 lm_head): on the branch a GPU takes (the census stands the SM89+ gate in as SM90; torch._scaled_mm on
    torch's CPU kernel), the head's matrix multiply reads the e4m3 copy: its gemm-bytes at least halve (a BF16 head
    2x, the tiny model's fp32 head 4x) and no other GEMM changes. Fails on the stock wheel (the switch is never read:
    every metric None) and on the patch as declared before (bytes-moved, host<->device bytes: 80 -> 80)."""
    patched = arms_for(REPO, "sglang").patched
    off = census(patched, model, "decode-step")
    on = census(patched, model, "decode-step", {"SGLANG_OPT_FP8_LM_HEAD": "1"})
    assert on["metrics"]["gemm-bytes"] is not None, on["notes"]

    def at(doc: dict[str, Any], file: str) -> int:
        return sum(int(n) for site, n in doc["sites"]["gemm-bytes"] if file in site)

    head_off, head_on = at(off, "logits_processor.py"), at(on, "fp8_lm_head.py")
    assert head_off > 0 and head_on > 0, (off["sites"]["gemm-bytes"], on["sites"]["gemm-bytes"])
    assert at(on, "logits_processor.py") == 0  # the stock head GEMM no longer runs
    assert head_off / head_on > 1.9
    body_off = sum(int(n) for _, n in off["sites"]["gemm-bytes"]) - head_off
    body_on = sum(int(n) for _, n in on["sites"]["gemm-bytes"]) - head_on
    assert body_off == body_on
    assert on["metrics"]["gemm-bytes"] < off["metrics"]["gemm-bytes"]


def test_acceptance_stats_are_booked_without_a_host_sync(model: Path) -> None:
    """0010 (acceptance histograms by regime): its switch is read where the scheduler books each verify's accepted
    drafts (batch_result_processor.py, inside process_batch_result), so decode-step-spec (decode-step of a speculative
    engine) counts it: the bookkeeping reads the host copy of the accepted counts and adds no host sync, at the same
    sites. Fails on the stock wheel (the switch is never read: every metric None), and on a bookkeeping that read a
    device tensor (one more sync per step)."""
    patched = arms_for(REPO, "sglang").patched
    off = census(patched, model, "decode-step-spec")
    on = census(patched, model, "decode-step-spec", {"SGLANG_OPT_SPEC_ACCEPT_STATS": "1"})
    assert "SGLANG_OPT_SPEC_ACCEPT_STATS" in on["detail"]["flags_read"]
    assert on["metrics"]["host-syncs"] is not None, on["notes"]
    assert off["metrics"]["host-syncs"] > 0  # the verify's readback: the step is a speculative one
    assert on["metrics"]["host-syncs"] == off["metrics"]["host-syncs"]
    assert on["sites"]["host-syncs"] == off["sites"]["host-syncs"]


def test_sampled_decode_step_counts_the_filtered_draw(model: Path) -> None:
    """decode-step-sampled takes the pytorch backend's filtered path (top-k 20, top-p 0.8). 0004 (the Gumbel draw
    after the filters): its switch is read, and the step's eager launches drop by multinomial's validity checks
    (13 ops of multinomial's kernel -> exponential_, clamp_min_, div, argmax); host syncs are unchanged (the checks
    are device-side asserts). Fails on the stock wheel (the switch is never read: every metric None)."""
    patched = arms_for(REPO, "sglang").patched
    off = census(patched, model, "decode-step-sampled")
    on = census(patched, model, "decode-step-sampled", {"SGLANG_OPT_GUMBEL_TOPK_TOPP_SAMPLE": "1"})
    assert off["detail"]["kinds"].get("expanded:aten.multinomial") == 3  # one filtered draw per step
    assert on["metrics"]["eager-launches"] is not None, on["notes"]
    assert off["metrics"]["eager-launches"] - on["metrics"]["eager-launches"] == 9.0
    assert on["metrics"]["host-syncs"] == off["metrics"]["host-syncs"]
    assert "expanded:aten.multinomial" not in on["detail"]["kinds"]
    assert on["detail"]["kinds"]["eager-launches:aten.exponential_"] == 3


# draft-extend-draft on stock (llama STANDALONE, intel_amx attention): the violations of one combined
# draft-extend + next-draft capture region, per step, by zone (docs/engines/sglang.md, "Combined draft-extend + draft
# graph: what the census sees"). A patch that removes one must update this table.
FBI = "sglang/srt/model_executor/forward_batch_info.py"
SPAN_OUTSIDE = {
    "outside:prepare_for_draft_extend": {
        f"pageable H2D copy (Tensor.to) at {FBI}:1236": 1.0,  # extend_seq_lens from the host list
        f"pageable H2D copy (Tensor.to) at {FBI}:1239": 1.0,  # extend_prefix_lens from the host list
        f"host sync (aten._local_scalar_dense) at {FBI}:2402": 2.0,  # compute_position_torch's per-row arange
    },
    "outside:IntelAMXAttnBackend.init_forward_metadata": {
        # torch.max(extend_seq_lens).item()
        "host sync (aten._local_scalar_dense) at sglang/srt/layers/attention/intel_amx_backend.py:146": 1.0
    },
    "outside:ModelRunner.forward": {  # the eager runner's seq_lens_cpu mirror (host to host on CUDA: an over-count)
        "pageable H2D copy (copy_) at sglang/srt/model_executor/cuda_graph_buffer_registry.py:514": 1.0,
        "blocking H2D copy (copy_) at sglang/srt/model_executor/cuda_graph_buffer_registry.py:514": 1.0,
    },
}


def _check_span(doc: dict[str, Any]) -> None:
    assert doc["steps"] == 3, doc["notes"]
    assert doc["metrics"]["capturable"] is False
    for entered in doc["detail"]["zones_entered"]:  # every zone ran once per step, the graph zones included
        assert entered["graph:draft-model-forward"] == 1 and entered["graph:draft_forward"] == 1, entered
        assert (
            entered["outside:prepare_for_draft_extend"] == 1
            and entered["outside:build_eagle_verify_input"] == 1
        )
    assert doc["detail"]["violations"]["outside"] == SPAN_OUTSIDE
    assert doc["detail"]["standin_violations"] == []
    assert doc["detail"]["standin_kernels"]["graph-launches:kernel:sgl_kernel.extend_attention_cpu"] >= 3


def test_draft_extend_draft_span_is_not_capturable_on_stock(stock: Arm, model: Path) -> None:
    """One combined draft-extend + draft region on stock: capturable False, every violation host-side (the model
    forwards the graph runners capture today are clean on this path); 4 host syncs and 3 pageable copies per step."""
    doc = census(stock, model, "draft-extend-draft")
    _check_span(doc)
    assert doc["detail"]["violations"]["graph"] == {}
    assert doc["metrics"]["host-syncs"] == 4.0 and doc["metrics"]["pageable-copies"] == 3.0
    seen = [v for side in doc["detail"]["violations"].values() for zone in side.values() for v in zone]
    assert not any("data-dependent" in v for v in seen)  # no nonzero / masked index / unique in the span


def test_draft_extend_draft_span_nextn_moe_syncs_inside_the_forward(stock: Arm) -> None:
    """The same region on the NextN DeepSeek checkpoint: the host side as llama's, plus one sync inside the draft
    model's forward (the CPU MoE fallback moe_forward_native's tokens_per_expert.cpu(); CUDA runs a fused MoE
    kernel there)."""
    from nextn_support import build_nextn_checkpoint

    doc = census(stock, build_nextn_checkpoint(REPO), "draft-extend-draft", algorithm="NEXTN")
    _check_span(doc)
    assert doc["detail"]["violations"]["graph"] == {
        "graph:draft-model-forward": {
            "host sync (Tensor.cpu) at sglang/srt/layers/moe/fused_moe_native.py:82": 1.0
        }
    }
    assert doc["metrics"]["host-syncs"] == 5.0 and doc["metrics"]["pageable-copies"] == 3.0


def test_draft_extend_draft_span_three_draft_steps(stock: Arm, model: Path) -> None:
    """k = 3 (topk 1): draft_forward runs the draft model twice through the draft ModelRunner, inside what
    EAGLEDraftCudaGraphRunner captures; the host side is k = 1's, and the only violation under the draft graph is the
    eager runner's seq_lens_cpu mirror copy (host to host on CUDA: the census's cpu_is_device over-count)."""
    doc = census(stock, model, "draft-extend-draft", num_draft=3)
    assert "STANDALONE k=3" in doc["notes"][0]
    for entered in doc["detail"]["zones_entered"]:
        assert entered["graph:draft-model-forward"] == 3, entered
    assert doc["detail"]["violations"]["outside"] == SPAN_OUTSIDE
    registry = "sglang/srt/model_executor/cuda_graph_buffer_registry.py:514"
    assert doc["detail"]["violations"]["graph"] == {
        "graph:draft_forward > outside:ModelRunner.forward": {
            f"pageable H2D copy (copy_) at {registry}": 2.0,
            f"blocking H2D copy (copy_) at {registry}": 2.0,
        }
    }
    assert doc["metrics"]["capturable"] is False
    assert doc["metrics"]["host-syncs"] == 6.0 and doc["metrics"]["pageable-copies"] == 5.0


def test_draft_extend_draft_span_triton_keeps_host_lengths(stock: Arm, model: Path) -> None:
    """The same region with the triton attention backend (needs_cpu_seq_lens False; its kernels run in Triton's CPU
    interpreter): intel_amx's .item() at :146 is gone (the triton backend's metadata init has no violation), but the
    draft-extend still builds its lengths from the host lists (:1236/:1239) and its positions with the torch loop
    (:2402). The synchronous scheduler, which 0.5.23 forces for speculative decoding on CPU, always keeps
    batch.seq_lens_cpu, so prepare_for_draft_extend's device-only branch (seq_lens_cpu None) is never taken; only the
    overlap scheduler's resolve drops the mirror. 3 host syncs and 3 pageable copies per step: not capturable."""
    doc = census(stock, model, "draft-extend-draft", attention_backend="triton")
    assert "triton attention" in doc["notes"][0]
    assert doc["steps"] == 3, doc["notes"]
    for entered in doc["detail"]["zones_entered"]:
        assert entered["outside:TritonAttnBackend.init_forward_metadata"] == 1, entered
        assert not any("IntelAMX" in zone for zone in entered), entered
        assert entered["graph:draft-model-forward"] == 1 and entered["outside:prepare_for_draft_extend"] == 1
    host_side = {zone: v for zone, v in SPAN_OUTSIDE.items() if "IntelAMX" not in zone}
    assert doc["detail"]["violations"] == {"graph": {}, "outside": host_side}
    assert doc["metrics"]["capturable"] is False
    assert doc["metrics"]["host-syncs"] == 3.0 and doc["metrics"]["pageable-copies"] == 3.0
    assert doc["detail"]["standin_violations"] == []
    # the attention ran in Triton, not in the stand-in's extend_attention_cpu (intel_amx's op)
    assert not any("extend_attention_cpu" in k for k in doc["detail"]["standin_kernels"])
