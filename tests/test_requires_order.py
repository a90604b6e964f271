"""Overlay-Requires honoured wherever the order of a series changes: a reorder (by hand in `series`, or in the
worktree and written back by refresh) fails lint naming both patches, apply refuses it even for a prefix, a prefix of an
ordered series never cuts a required patch, and `rebase --skip` names every patch that required the skipped one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rebase_support import PKG, add_patches, make_rebase_world, make_release
from support import GIT_ENV, TRAILERS, Cli, World

CORE = "0001-core-shorter-greeting.patch"
UTIL = "0002-util-double.patch"


def requires(name: str) -> str:
    return TRAILERS + f"Overlay-Requires: {name}\n"


def two_patches(world: World) -> None:
    """core, then util which requires core (the two touch different files, so either order applies)."""
    world.commit_change(PKG + "core.py", 'prefix = "hello"', 'prefix = "hi"', "core: shorter greeting")
    world.commit_change(
        PKG + "util.py", "return 2 * x", "return x + x", "util: double", trailers=requires(CORE)
    )
    assert world.export_series() == [CORE, UTIL]


def test_a_series_reordered_by_hand_fails_lint_naming_both_patches(world: World, cli: Cli) -> None:
    two_patches(world)
    root = ["--root", str(world.root)]
    assert cli(*root, "lint", "demo").code == 0
    series = world.series_dir / "series"
    series.write_text(f"# base: demo 1.2.0 {world.base_commit}\n{UTIL}\n{CORE}\n")
    r = cli(*root, "lint", "demo")
    assert r.code == 2, r.err
    lines = r.err.splitlines()
    at = lines.index(
        f"ERROR demo/{UTIL}: Overlay-Requires '{CORE}': that patch comes after it (position 2, this one is 1)"
    )
    assert lines[at + 1].startswith("TIP put the required patch back before this one")
    # apply refuses it too, and so does a prefix that holds only the requiring patch (the required one cut off)
    for extra in ((), ("--upto", "1")):
        r = cli(*root, "apply", "demo", "--out", str(world.root / "out"), *extra)
        assert r.code == 2 and f"{UTIL}: Overlay-Requires '{CORE}': that patch comes after it" in r.err, r.err
    assert not (world.root / "out").exists()


def test_a_prefix_of_an_ordered_series_keeps_what_it_requires(world: World, cli: Cli) -> None:
    two_patches(world)
    root = ["--root", str(world.root)]
    r = cli(*root, "apply", "demo", "--upto", "1", "--out", str(world.root / "out"))
    assert r.code == 0 and "WARNING" not in r.err, r.err
    assert ".1.g" in Path(r.out.strip().splitlines()[-1]).name.removeprefix("demo_engine-1.2.0+ovl.")
    r = cli(*root, "-q", "checkout", "demo", "--upto", "1")
    assert r.code == 0 and "WARNING" not in r.err, r.err


def _edit_todo(wt: Path, script: str) -> None:
    env = {**os.environ, **GIT_ENV, "GIT_SEQUENCE_EDITOR": script}
    subprocess.run(
        ["git", "rebase", "-q", "-i", "overlay/base"], cwd=wt, env=env, check=True, capture_output=True
    )


def test_refresh_after_dropping_a_required_commit_warns_and_lint_refuses(world: World, cli: Cli) -> None:
    two_patches(world)
    root = ["--root", str(world.root)]
    wt = Path(cli(*root, "-q", "checkout", "demo").out.strip())
    _edit_todo(wt, "sed -i '1s/^pick/drop/'")  # drop core, keep util (which requires it)
    r = cli(*root, "refresh", "demo")
    assert r.code == 0, r.err
    assert f"WARNING 0001-util-double.patch: Overlay-Requires '{CORE}': no such patch in the series" in r.err
    r = cli(*root, "lint", "demo")
    assert (
        r.code == 2
        and f"0001-util-double.patch: Overlay-Requires '{CORE}': no such patch in the series" in r.err
    )


def test_refresh_after_a_reorder_fails_lint_naming_both(world: World, cli: Cli) -> None:
    two_patches(world)
    root = ["--root", str(world.root)]
    wt = Path(cli(*root, "-q", "checkout", "demo").out.strip())
    _edit_todo(wt, "sed -i '1{h;d};2{G}'")  # util first, then core
    r = cli(*root, "refresh", "demo")
    assert r.code == 0 and "WARNING 0001-util-double.patch" in r.err, r.err
    assert sorted(p.name for p in world.series_dir.glob("*.patch")) == [
        "0001-util-double.patch",
        "0002-core-shorter-greeting.patch",
    ]
    r = cli(*root, "lint", "demo")
    assert r.code == 2
    assert any(
        "0001-util-double.patch" in line and "core-shorter-greeting" in line and "comes after it" in line
        for line in r.err.splitlines()
    ), r.err
    # putting the order back (in the worktree, written back by refresh) makes lint pass again
    _edit_todo(wt, "sed -i '1{h;d};2{G}'")
    r = cli(*root, "refresh", "demo")
    assert r.code == 0 and "WARNING" not in r.err, r.err
    assert cli(*root, "lint", "demo").code == 0


def test_rebase_skip_names_every_patch_that_required_the_skipped_one(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["gone"])
    gone = sorted(p.name for p in world.series_dir.glob("*.patch"))[0]
    world.commit_change(
        PKG + "util.py", "return 2 * x", "return x + x", "util: double by addition", trailers=requires(gone)
    )
    world.commit_change(
        PKG + "core.py",
        'prefix = "hello"',
        'prefix = "hi"',
        "core: shorter greeting",
        trailers=requires(gone),
    )
    names = world.export_series()
    release = make_release(world)
    root = ["--root", str(world.root)]
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3 and "WARNING" not in r.err, r.err
    r = cli(*root, "rebase", "demo", "--skip")
    assert r.code == 3 and "stopped for review" in r.err, r.err
    assert f"WARNING --skip dropped {gone}, which {names[1]}, {names[2]} require (Overlay-Requires)" in r.err
    for name in names[1:]:
        assert f"WARNING {name}: Overlay-Requires '{gone}': no such patch in the series" in r.err
