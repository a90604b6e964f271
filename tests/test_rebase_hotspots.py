"""overlay lint warns (never fails) when one region of an upstream file is touched by more than a third of the
series' patches: the spot where one upstream change conflicts them all in the next rebase."""

from __future__ import annotations

import json
from pathlib import Path

from overlay.core.lint import merge_hotspots
from overlay.core.series import load_series
from support import Cli, World, make_world

CORE = "python/demo_pkg/core.py"


def _flag_patches(world: World, n: int) -> None:
    # every patch declares its flag right under __version__, on top of the ones before it
    last = '__version__ = "1.2.0"\n'
    for i in range(n):
        line = f'FLAG_{i} = "OVL_FLAG_{i}"\n'
        world.commit_change(CORE, last, last + line, f"core: flag {i}")
        last = line


def test_lint_warns_about_a_region_most_patches_touch(tmp_path: Path, cli: Cli) -> None:
    world = make_world(tmp_path)
    _flag_patches(world, 3)
    world.commit_change(CORE, "y = x * 2", "y = x * 3", "core: step triples")
    world.export_series()
    series = load_series(world.series_dir)
    spots = merge_hotspots(series.patches)
    assert [(h.path, len(h.patches)) for h in spots] == [(CORE, 3)]
    assert spots[0].first <= 3 <= spots[0].last  # in the pinned file's line numbers (__version__ is line 3)
    r = cli("--root", str(world.root), "lint", "demo")
    assert r.code == 0, r.err  # a warning, not a failure
    assert f"WARNING demo: merge hotspot: 3 of the 4 patches touch {CORE} lines" in r.err
    r = cli("--root", str(world.root), "lint", "demo", "--json")
    assert json.loads(r.out)["engines"][0]["warnings"][0].startswith("merge hotspot: 3 of the 4 patches")


def test_no_warning_when_a_third_or_fewer_touch_the_region(tmp_path: Path, cli: Cli) -> None:
    world = make_world(tmp_path)
    _flag_patches(world, 3)
    for old, new in (
        ("return a + b", "return b + a"),
        ("self.size = size", "self.size = int(size)"),
        ("y = x * 2", "y = x * 3"),
        ('prefix = "hello"', 'prefix = "hi"'),
        ("return y + self.size", "return self.size + y"),
        ('"""A tiny engine."""', '"""An engine."""'),
    ):
        world.commit_change(CORE, old, new, f"core: {new.split()[0]}")
    world.export_series()
    assert merge_hotspots(load_series(world.series_dir).patches) == []  # 3 of 9 is not more than a third
    r = cli("--root", str(world.root), "lint", "demo")
    assert r.code == 0 and "hotspot" not in r.err, r.err
