"""0001 (VLLM_CPU_FORK_WORKERS=1): the CPU build forks its engine processes where that is safe, stock vs patched,
through the check's own ``cold-start`` census (workers/vllm_cold.py, via the worker's census task; long: four cold
starts of the real engine, 1-4 minutes each on the 2-core machine).

- flag on: the engine core (started from a parent that was not launched with the LD_PRELOAD vLLM's CPU platform
  asks for) is spawned as in stock, and it forks the worker, which imports almost nothing of its own;
  ``module-imports`` drops by most of stock's worker count; greedy tokens are stock's; the worker's OpenMP binding
  (its threads' allowed CPUs, torch's thread count) is stock's;
- flag on, parent launched with that LD_PRELOAD: the engine core is forked too;
- flag off: every process is spawned as in stock, and each imports what stock's does.

Every cold start is a first launch: the census gives each its own empty ``VLLM_CACHE_ROOT`` (workers/vllm_cold.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arm, Arms, arms_for
from overlay.engines import get_adapter

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.long
FLAG = {"VLLM_CPU_FORK_WORKERS": "1"}
LIBGOMP = (
    "import glob, os, torch; d = os.path.dirname(torch.__file__); "
    "print(sorted(glob.glob(os.path.join(d, 'lib', 'libgomp*.so*')) + "
    "glob.glob(os.path.join(os.path.dirname(d), 'torch.libs', 'libgomp*.so*')))[0])"
)


@pytest.fixture(scope="module")
def arms() -> Arms:
    # the series up to 0001: the later loading patches (0002, 0003) import fewer modules in every process, flag or
    # not, which the flag-off comparison with stock would count against 0001
    return arms_for(REPO, "vllm", upto=1)


class ColdStarts:
    """One cold-start census per configuration, run on first use and kept for the module."""

    def __init__(self, arms: Arms, model: Path) -> None:
        self.arms = arms
        self.model = model
        self._runs: dict[str, dict[str, Any]] = {}

    def _run(self, arm: Arm, env: dict[str, str]) -> dict[str, Any]:
        run_arm = arm.with_env(env)
        return get_adapter("vllm").run(
            run_arm,
            {"task": "census", "model": str(self.model), "scenario": "cold-start", "steps": 1},
            timeout=1800,
        )

    def get(self, name: str) -> dict[str, Any]:
        if name not in self._runs:
            if name == "stock":
                self._runs[name] = self._run(self.arms.stock, {})
            elif name == "off":
                self._runs[name] = self._run(self.arms.patched, {})
            elif name == "on":
                self._runs[name] = self._run(self.arms.patched, FLAG)
            elif name == "on+preload":
                proc = self.arms.patched.run(["-c", LIBGOMP], timeout=600)
                assert proc.returncode == 0, proc.stderr[-2000:]
                self._runs[name] = self._run(self.arms.patched, {**FLAG, "LD_PRELOAD": proc.stdout.strip()})
            else:
                raise KeyError(name)
        return self._runs[name]


@pytest.fixture(scope="module")
def cold(arms: Arms, model: Path) -> ColdStarts:
    return ColdStarts(arms, model)


def procs(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["role"]: p for p in result["detail"]["processes"] if p["counted"]}


def test_flag_on_forks_the_worker_which_imports_almost_nothing(cold: ColdStarts) -> None:
    stock, on = cold.get("stock"), cold.get("on")
    s, p = procs(stock), procs(on)
    assert {r: s[r]["started"] for r in ("parent", "engine core", "worker")} == {
        "parent": "launch",
        "engine core": "spawn",
        "worker": "spawn",
    }
    # the parent was launched without vLLM's LD_PRELOAD, so the engine core is spawned as in stock
    assert {r: p[r]["started"] for r in ("parent", "engine core", "worker")} == {
        "parent": "launch",
        "engine core": "spawn",
        "worker": "fork",
    }
    assert s["worker"]["modules"] > 3000  # a spawned worker imports torch and vLLM again
    assert p["worker"]["modules"] < 0.2 * s["worker"]["modules"]
    assert p["worker"]["inherited"] > 3000
    total_stock, total_on = stock["metrics"]["module-imports"], on["metrics"]["module-imports"]
    assert total_on < total_stock - 0.8 * s["worker"]["modules"]
    assert on["detail"]["first_token"] == stock["detail"]["first_token"]
    assert on["detail"]["greedy"] == stock["detail"]["greedy"]
    assert on["detail"]["time_to_first_token_s"] > 0  # reported, not judged


def test_the_forked_worker_keeps_its_openmp_binding(cold: ColdStarts) -> None:
    s, p = procs(cold.get("stock"))["worker"], procs(cold.get("on"))["worker"]
    assert (s["started"], p["started"]) == ("spawn", "fork")  # a forked worker's binding, not a spawned one's
    # stock's binding comes from OMP_NUM_THREADS / GOMP_CPU_AFFINITY read by a fresh OpenMP runtime; the forked
    # worker's runtime was initialised in the engine core, so the patch applies them itself
    assert p["omp_env"].get("OMP_NUM_THREADS") == s["omp_env"].get("OMP_NUM_THREADS") is not None
    assert p["torch_threads"] == s["torch_threads"] == int(s["omp_env"]["OMP_NUM_THREADS"])
    assert p["thread_cpus"] == s["thread_cpus"]
    assert p["libs"] == s["libs"]  # the same OpenMP copies mapped (the engine core's preload, inherited)


def test_flag_on_with_the_preload_forks_the_engine_core_too(cold: ColdStarts) -> None:
    stock, both = cold.get("stock"), cold.get("on+preload")
    s, p = procs(stock), procs(both)
    assert p["engine core"]["started"] == "fork"
    assert p["worker"]["started"] == "fork"
    assert p["engine core"]["modules"] < 0.2 * s["engine core"]["modules"]
    assert p["worker"]["modules"] < 0.2 * s["worker"]["modules"]
    assert p["worker"]["thread_cpus"] == s["worker"]["thread_cpus"]
    assert p["worker"]["torch_threads"] == s["worker"]["torch_threads"]
    assert both["detail"]["greedy"] == stock["detail"]["greedy"]


def test_flag_off_is_stock(cold: ColdStarts) -> None:
    stock, off = cold.get("stock"), cold.get("off")
    s, p = procs(stock), procs(off)
    assert {r: q["started"] for r, q in p.items()} == {r: q["started"] for r, q in s.items()}
    for role in ("parent", "engine core", "worker"):
        assert abs(p[role]["modules"] - s[role]["modules"]) <= 0.01 * s[role]["modules"], role
    assert p["worker"]["thread_cpus"] == s["worker"]["thread_cpus"]
    assert off["detail"]["greedy"] == stock["detail"]["greedy"]
