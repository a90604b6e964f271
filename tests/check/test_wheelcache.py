"""The check's wheel cache (src/overlay/check/wheelcache.py) on the synthetic demo engine in tmp_path: a second run
with an unchanged series reuses the patched wheel (verified), one changed patch byte rebuilds exactly the wheels
that hold that patch, a corrupt or partial entry is rebuilt, and `overlay check` says which wheels it reused."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from overlay.check import wheelcache
from overlay.check.envs import Arm
from overlay.check.wheelcache import ENTRY, patched_wheel
from overlay.core.build import apply_engine
from overlay.fsutil import sha256_file
from overlay.paths import layout
from support import World, fallback_adapter


def _no_build(**kwargs: Any) -> Any:
    raise AssertionError(f"rebuilt although the inputs are unchanged: {kwargs}")


def test_unchanged_series_reuses_the_wheel_and_one_patch_byte_rebuilds(
    world2: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = world2.root
    first = patched_wheel(root=root, engine="demo")
    prefix = patched_wheel(root=root, engine="demo", upto=1)
    assert not first.from_cache and not prefix.from_cache and first.key != prefix.key
    assert first.wheel.parent.parent == layout(root).check_wheels / "demo"
    entry = json.loads((first.wheel.parent / ENTRY).read_text())
    assert entry["sha256"] == sha256_file(first.wheel) and entry["key"] == first.key
    # the cached wheel is the wheel `overlay apply` makes
    applied = apply_engine(root=root, engine="demo", out_dir=root / "applied").wheel
    assert applied.name == first.wheel.name and applied.read_bytes() == first.wheel.read_bytes()

    with monkeypatch.context() as m:
        m.setattr(wheelcache, "apply_engine", _no_build)
        again = patched_wheel(root=root, engine="demo")
        prefix_again = patched_wheel(root=root, engine="demo", upto=1)
    assert again.from_cache and prefix_again.from_cache
    assert (again.wheel, again.key, again.version) == (first.wheel, first.key, first.version)
    assert again.series_sha256 == first.series_sha256 and again.patches == 2

    second = world2.series_dir / (world2.series_dir / "series").read_text().splitlines()[2]
    raw = second.read_bytes()
    second.write_bytes(raw.replace(b"Changes ", b"Changed ", 1))  # one byte of patch 2's message
    assert second.read_bytes() != raw
    changed = patched_wheel(root=root, engine="demo")
    assert not changed.from_cache and changed.key != first.key and changed.version != first.version
    with monkeypatch.context() as m:  # patch 1 alone did not change: its prefix wheel is still the cached one
        m.setattr(wheelcache, "apply_engine", _no_build)
        assert patched_wheel(root=root, engine="demo", upto=1).from_cache


def test_a_corrupt_or_partial_entry_is_rebuilt(world2: World) -> None:
    root = world2.root
    first = patched_wheel(root=root, engine="demo")
    good = first.wheel.read_bytes()
    first.wheel.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, one bit flipped
    rebuilt = patched_wheel(root=root, engine="demo")
    assert not rebuilt.from_cache and rebuilt.wheel.read_bytes() == good
    (rebuilt.wheel.parent / ENTRY).unlink()  # a build killed before it recorded the entry
    assert not patched_wheel(root=root, engine="demo").from_cache
    (rebuilt.wheel.parent / ENTRY).write_text("{not json")
    assert not patched_wheel(root=root, engine="demo").from_cache
    assert patched_wheel(root=root, engine="demo").from_cache


def test_the_check_report_says_the_wheel_came_from_the_cache(
    world2: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from overlay.check import run
    from overlay.check.options import CheckOptions

    def arm(root: Path, manifest: Any, wheel: Path, *, name: str, reporter: Any = None) -> Arm:
        return Arm(name=name, engine="demo", venv=root / "venv", wheel=wheel, version="1")

    monkeypatch.setattr(run, "arm_env", arm)  # no venvs: the fallback path runs no engine
    monkeypatch.setattr(run, "backend_versions", lambda arm, names: {})
    reports = []
    for _ in range(2):
        report = run.run_check(
            root=world2.root, options=CheckOptions(engine="demo"), adapter=fallback_adapter()
        )
        reports.append(report)
    built, reused = (r["wheel_cache"] for r in reports)
    assert [(w["arm"], w["from_cache"]) for w in built] == [("patched", False)]
    assert [(w["arm"], w["from_cache"]) for w in reused] == [("patched", True)]
    assert (
        reused[0]["wheel"] == reports[0]["arms"]["patched"]["wheel"] and reused[0]["key"] == built[0]["key"]
    )
    assert not any("wheel cache" in n for n in reports[0]["notes"])
    note = [n for n in reports[1]["notes"] if "from the check's wheel cache" in n]
    assert note and note[0].endswith(": patched")
    written = json.loads((layout(world2.root).reports / "demo-check.json").read_text())
    assert written["wheel_cache"][0]["from_cache"] is True and reports[1]["verdict"] == "pass"


def test_entries_unused_for_a_week_are_pruned_when_the_next_wheel_is_built(world2: World) -> None:
    root = world2.root
    old = patched_wheel(root=root, engine="demo", upto=1)
    engine_dir = old.wheel.parent.parent
    stale = engine_dir / ("0" * 32)  # a build that never finished, long ago
    stale.mkdir()
    week_ago = old.wheel.stat().st_mtime - (wheelcache.UNUSED_DAYS + 1) * 86400
    for path in (old.wheel.parent / ENTRY, stale):
        os.utime(path, (week_ago, week_ago))
    # a hit refreshes the entry's last use: nothing is pruned by building another wheel then
    assert patched_wheel(root=root, engine="demo", upto=1).from_cache
    assert wheelcache.prune(engine_dir, keep="") == [stale.name]
    (old.wheel.parent / ENTRY).touch()
    os.utime(old.wheel.parent / ENTRY, (week_ago, week_ago))
    fresh = patched_wheel(root=root, engine="demo")  # a miss prunes the week-old entry
    assert not fresh.from_cache and fresh.wheel.is_file()
    assert sorted(p.name for p in engine_dir.iterdir() if p.is_dir()) == [fresh.wheel.parent.name]
