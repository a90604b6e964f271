"""The "mtp" speculative run of `overlay check sglang --draft-kind deepseek_v3-nextn-random`, without an engine: the
adapter picks the NextN checkpoint, spec_protocol labels it "mtp" and compares it with the run's own serial baseline,
and the worker's spec task serves it with NEXTN (plugin on the path for that engine only). The engine run itself is
tests/engines/sglang/test_check_mtp.py (long)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from overlay.check.adapter import Models
from overlay.check.envs import Arm
from overlay.check.models import build
from overlay.check.options import CheckOptions
from overlay.check.steps import spec_protocol
from overlay.engines import WORKERS
from overlay.engines.sglang import SglangAdapter
from overlay.progress import NullReporter
from overlay.schemas.documents import WorkerRequest

REPO = Path(__file__).resolve().parents[2]
NEXTN = "deepseek_v3-nextn-random"
SERIAL = [[5, 6, 7, 8], [9, 9, 9, 9]]  # the MTP checkpoint's own serial greedy text
TARGET_SERIAL = [[1, 2, 3, 4], [1, 2, 3, 4]]  # the check's target (what every other run compares with)


def _arm(name: str) -> Arm:
    return Arm(name=name, engine="sglang", venv=Path("/nonexistent"), wheel=Path("x.whl"), version="0")


def _result(tokens: list[int], accepted: int, cycles: int) -> dict[str, Any]:
    stats = {"accepted": accepted, "drafted": 3 * cycles, "cycles": cycles, "histogram": None}
    return {"tokens": tokens, "from_draft": [], "stats": stats}


class FakeAdapter:
    """Answers spec requests as the worker does: the "mtp" label on its own checkpoint with its serial baseline."""

    engine = "sglang"

    def __init__(self) -> None:
        self.requests: list[WorkerRequest] = []

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        self.requests.append(request)
        assert request["task"] == "spec"
        drafts: dict[str, Any] = {}
        for label in request["drafts"]:
            if label == "mtp":
                drafts[label] = {
                    "results": [_result(SERIAL[0], 2, 2), _result(SERIAL[1], 1, 3)],
                    "serial": SERIAL,
                    "about": {"algorithm": "NEXTN", "notes": ["plugin on PYTHONPATH"]},
                }
            else:
                drafts[label] = {"results": [_result(t, 3, 1) for t in TARGET_SERIAL]}
        return {"drafts": drafts}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mtp-root")


def _spec(root: Path, tmp: Path, draft_kind: str) -> tuple[FakeAdapter, dict[str, Any]]:
    adapter = FakeAdapter()
    models = Models(
        target=build("llama-random", root=root), target_kind="llama-random", draft=root, draft_kind=draft_kind
    )
    greedy = {name: {"outputs": TARGET_SERIAL} for name in ("stock", "patched")}
    out = spec_protocol(
        adapter,  # type: ignore[arg-type]  # the spec protocol only calls run()
        _arm("stock"),
        _arm("patched"),
        models,
        [[0, 1], [0, 2]],
        greedy,
        CheckOptions(engine="sglang"),
        tmp,
        NullReporter(),
    )
    return adapter, out


def test_a_nextn_draft_kind_is_the_mtp_run(root: Path, tmp_path: Path) -> None:
    adapter, out = _spec(root, tmp_path, NEXTN)
    assert [list(r["drafts"]) for r in adapter.requests] == [["self", "never", "mtp"]] * 2  # type: ignore[typeddict-item]
    assert "real" not in out
    mtp = out["mtp"]
    # compared with its own checkpoint's serial text (the target's would differ)
    assert mtp["stock_identical_to_serial"] is True and mtp["patched_identical_to_serial"] is True
    assert mtp["algorithm"] == "NEXTN" and mtp["notes"] == ["plugin on PYTHONPATH"]
    assert mtp["patched"]["acceptance_length"] == pytest.approx((3 + 5) / 5)
    assert out["self"]["patched_identical_to_serial"] is True and "algorithm" not in out["self"]


def test_a_drafter_kind_stays_the_real_run(root: Path, tmp_path: Path) -> None:
    adapter, out = _spec(root, tmp_path, "llama-draft-random")
    assert list(adapter.requests[0]["drafts"]) == ["self", "never", "real"]  # type: ignore[typeddict-item]
    assert "mtp" not in out and out["real"]["patched_identical_to_serial"] is True


def test_adapter_builds_the_nextn_checkpoint_as_the_mtp_draft(root: Path) -> None:
    models = SglangAdapter().models(
        root=root,
        arm=_arm("stock"),
        model=None,
        draft=None,
        reporter=NullReporter(),
        target_kind="llama-random",  # random: no mlx needed
        draft_kind=NEXTN,
    )
    assert models.target == build("llama-random", root=root) and models.target_kind == "llama-random"
    assert models.draft == build(NEXTN, root=root) and models.draft_kind == NEXTN


# ------------------------------------------------------------------------------------------- the worker's spec task


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "support" / "testbackends" / "sglang"))
    # census_sites sits beside the worker (in its script folder when it runs)
    monkeypatch.syspath_prepend(str(WORKERS))
    spec = importlib.util.spec_from_file_location("overlay_test_sglang_worker", WORKERS / "sglang_worker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_worker_serves_mtp_with_nextn_and_the_plugin_for_that_engine_only(
    worker: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setenv("PYTHONPATH", "/arm/site")
    monkeypatch.delenv(worker._DRAFT_REPORT, raising=False)

    def fake_generate(
        req: Any, model: str, spec: dict[str, Any] | None, engine_args: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        plugins = str(worker.PLUGINS)
        calls.append(
            {
                "model": model,
                "spec": spec,
                "engine_args": engine_args,
                "plugin_on_path": plugins in sys.path
                and plugins in os.environ["PYTHONPATH"].split(os.pathsep),
            }
        )
        if spec is not None and spec["algorithm"] == "NEXTN":
            Path(os.environ[worker._DRAFT_REPORT]).write_text('{"class": "DeepseekV3ForCausalLMNextN"}')
        meta = {"spec_verify_ct": 2 if spec else 0}
        return [{"output_ids": [4, 5, 6], "meta_info": meta}]

    monkeypatch.setattr(worker, "_generate", fake_generate)
    out = worker.task_spec(
        {
            "task": "spec",
            "model": "/llama",
            "drafts": {"self": "/llama", "mtp": "/nextn"},
            "prompts": [[0]],
            "k": 3,
            "max_tokens": 3,
        }
    )["drafts"]
    self_call, serial_call, nextn_call = calls
    assert self_call == {
        "model": "/llama",
        "spec": {
            "algorithm": "STANDALONE",
            "draft_model": "/llama",
            "num_steps": 3,
            "topk": 1,
            "num_draft_tokens": 4,
        },
        "engine_args": None,
        "plugin_on_path": False,
    }
    # the serial baseline: a plain engine on the NextN checkpoint itself, MLA on intel_amx, without the plugin
    assert serial_call == {
        "model": "/nextn",
        "spec": None,
        "engine_args": {"attention_backend": "intel_amx"},
        "plugin_on_path": False,
    }
    assert nextn_call["model"] == "/nextn" and nextn_call["plugin_on_path"]
    assert nextn_call["spec"] == {**self_call["spec"], "algorithm": "NEXTN", "draft_model": "/nextn"}
    assert os.environ["PYTHONPATH"] == "/arm/site" and str(worker.PLUGINS) not in sys.path  # restored
    assert worker._DRAFT_REPORT not in os.environ
    mtp = out["mtp"]
    assert mtp["serial"] == [[4, 5, 6]] and mtp["about"]["algorithm"] == "NEXTN"
    assert mtp["about"]["draft_served"] == {"class": "DeepseekV3ForCausalLMNextN"}
    assert any("PYTHONPATH" in n for n in mtp["about"]["notes"])
    assert mtp["results"][0]["stats"]["cycles"] == 2 and "serial" not in out["self"]
