"""build/ is relocatable (OVERLAY_BUILD_DIR) and the artifact cache shareable between repositories (OVERLAY_CACHE_DIR)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from overlay.paths import BUILD_ENV, CACHE_ENV, layout
from support import Cli, World, make_world


def test_layout_defaults_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BUILD_ENV, raising=False)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    lay = layout(tmp_path)
    assert (lay.build, lay.cache, lay.wheels, lay.reports) == (
        tmp_path / "build",
        tmp_path / "build" / "cache",
        tmp_path / "build" / "wheels",
        tmp_path / "build" / "reports",
    )
    monkeypatch.setenv(BUILD_ENV, "out/b")  # relative: from the repository root
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "shared"))
    lay = layout(tmp_path)
    assert (lay.build, lay.cache, lay.tmp) == (
        tmp_path / "out" / "b",
        tmp_path / "shared",
        tmp_path / "out" / "b" / "tmp",
    )
    monkeypatch.setenv(BUILD_ENV, "  ")  # blank: the default
    assert layout(tmp_path).build == tmp_path / "build"


def test_apply_writes_under_the_relocated_build_dir_only(
    world2: World, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv(BUILD_ENV, str(elsewhere))
    r = cli("--root", str(world2.root), "apply", "demo")
    assert r.code == 0, r.err
    assert list((elsewhere / "wheels" / "demo").glob("demo_engine-1.2.0+ovl.*.2.g*.whl"))
    assert (elsewhere / "cache" / "artifacts").is_dir()
    assert not (world2.root / "build").exists()


def test_two_repositories_share_one_artifact_cache(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared-cache"
    monkeypatch.setenv(CACHE_ENV, str(shared))
    first = make_world(tmp_path / "a")
    assert cli("--root", str(first.root), "fetch", "demo").code == 0
    cached = list((shared / "artifacts").rglob("*.whl"))
    assert len(cached) == 1 and not (first.root / "build" / "cache").exists()
    second = make_world(tmp_path / "b")  # the same pinned bytes (the synthetic release is reproducible)
    shutil.rmtree(first.wheel.parent)  # the url the pin names is gone: only the shared cache can serve it
    r = cli("--root", str(second.root), "fetch", "demo", "--offline")
    assert r.code == 0, r.err
    assert "cached, sha256 ok" in r.err
