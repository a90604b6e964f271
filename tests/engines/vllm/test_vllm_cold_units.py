"""The cold-start census's counting (workers/vllm_cold.py ``summarize``) on synthetic per-process records, and the
per-process hook (workers/vllm_cold_hook.py) in a real fork of a small interpreter: default suite, no vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from overlay.core.mechanism import METRICS, parse_mechanism

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "src" / "overlay" / "engines" / "workers"))

import vllm_cold  # noqa: E402  (a worker script's module, from its folder)

T0 = 1000.0


def record(pid: int, name: str, modules: list[tuple[str, float | None]], **kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "pid": pid,
        "ppid": 1,
        "name": name,
        "argv": ["x"],
        "forked": False,
        "t_install": T0,
        "t_fork": None,
        "inherited": 0,
        "modules": [list(m) for m in modules],
        "starts": [],
        "threads": [{"tid": pid, "comm": "python", "cpus": "0-1", "python": True}],
        "torch_threads": 2,
        "omp_env": {},
        "libs": [],
    }
    doc.update(kw)
    return doc


def test_module_imports_is_a_metric_the_trailers_accept() -> None:
    assert "module-imports" in METRICS
    mech = parse_mechanism("module-imports decreases in cold-start", engine="vllm")
    assert (mech.metric, mech.scenario) == ("module-imports", "cold-start")


def test_summarize_counts_what_each_process_imported_itself_up_to_the_first_token() -> None:
    t_first = T0 + 50
    docs = [
        # the parent: everything it holds is its own; one module after the first token is not counted
        record(10, "MainProcess", [("os", T0), ("torch", T0 + 5), ("late", t_first + 1)]),
        # a spawned engine core: its own start-up modules too, and an untimed alias
        record(
            11,
            "EngineCore",
            [
                ("os", T0),
                ("torch", T0 + 20),
                ("six.moves", None),
                ("openai", T0 + 21),
                ("openai.types", T0 + 22),
            ],
        ),
        # a forked worker: only what it imported after the fork
        record(12, "VllmWorker-0", [("vllm.v1.worker.cpu_worker", T0 + 30)], forked=True, inherited=3),
        # multiprocessing's resource tracker: recorded, not an engine process
        record(9, "MainProcess", [("multiprocessing.resource_tracker", T0)]),
    ]
    docs[0]["starts"] = [
        {
            "name": "EngineCore",
            "method": "spawn",
            "threads": [
                {"tid": 10, "comm": "python", "cpus": "0-1", "python": True},
                {"tid": 13, "comm": "ZMQbg/IO/0", "cpus": "0-1", "python": False},
                {"tid": 14, "comm": "python", "cpus": "0-1", "python": False},
            ],
        }
    ]
    out = vllm_cold.summarize(docs, parent=10, t_first=t_first)
    roles = {p["role"]: p for p in out["processes"]}
    assert out["processes"][0]["role"] == "parent"
    assert roles["parent"]["modules"] == 2
    assert roles["engine core"]["modules"] == 5 and roles["engine core"]["untimed"] == 1
    assert roles["engine core"]["packages"]["openai"] == 2 and roles["parent"]["packages"]["openai"] == 0
    assert roles["engine core"]["packages"]["torch._inductor"] == 0
    assert roles["engine core"]["started"] == "spawn"
    assert roles["worker"]["modules"] == 1 and roles["worker"]["started"] == "fork"
    assert roles["resource tracker"]["counted"] is False
    assert out["total"] == 2 + 5 + 1
    assert out["starts"] == [
        {
            "by": "parent",
            "child": "EngineCore",
            "method": "spawn",
            "threads": 3,
            "unexplained_threads": ["python"],
        }
    ]


def test_peak_memory_sums_the_engine_processes_peaks_and_needs_all_of_them() -> None:
    assert "peak-memory" in METRICS
    mib = 2**20
    docs = [
        record(10, "MainProcess", [("os", T0)], memory={"rss": 400 * mib, "hwm": 500 * mib}),
        record(11, "EngineCore", [("os", T0)], memory={"rss": 300 * mib, "hwm": 450 * mib}),
        record(12, "VllmWorker-0", [("os", T0)], memory={"rss": 1200 * mib, "hwm": 1600 * mib}),
        record(
            9,
            "MainProcess",
            [("multiprocessing.resource_tracker", T0)],
            memory={"rss": mib, "hwm": 3000 * mib},
        ),
    ]
    out = vllm_cold.summarize(docs, parent=10, t_first=T0 + 1)
    roles = {p["role"]: p for p in out["processes"]}
    assert roles["worker"]["peak_rss_bytes"] == 1600 * mib
    assert out["peak_memory"] == (500 + 450 + 1600) * mib  # the helper's peak is not the engine's
    del docs[1]["memory"]  # a record without it (an older hook): no figure rather than a partial sum
    assert vllm_cold.summarize(docs, parent=10, t_first=T0 + 1)["peak_memory"] is None


def test_launch_time_is_this_process_start() -> None:
    t = vllm_cold.launch_time()
    assert t <= time.time()
    assert time.time() - t < 24 * 3600  # a test process started within a day, not at boot time 0


CHILD = """
import os, sys
sys.path.insert(0, sys.argv[1])
import vllm_cold_hook
vllm_cold_hook.install()
pid = os.fork()
if pid == 0:  # the child: one new import, then its record
    import colorsys
    vllm_cold_hook.dump()
    os._exit(0)
os.waitpid(pid, 0)
print(pid)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and fork")
def test_the_hook_counts_a_forked_childs_own_imports_only(tmp_path: Path) -> None:
    workers = REPO / "src" / "overlay" / "engines" / "workers"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(workers)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OVERLAY_COLD_OUT": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.strip())
    doc = json.loads((tmp_path / f"{pid}.json").read_text())
    assert doc["forked"] is True and doc["inherited"] > 20
    names = [m[0] for m in doc["modules"]]
    assert "colorsys" in names
    assert "os" not in names  # inherited from its parent
    assert (tmp_path / f"{pid}.alive").exists()
    assert (
        0 < doc["memory"]["rss"] <= doc["memory"]["hwm"] < 2**34
    )  # the child's own resident bytes, now and peak
