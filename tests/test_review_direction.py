"""overlay review reads upstream's change from --from to --to wherever the series sits, collapses what did not change,
names each symbol's file, counts hunk moves as flagged, shows upstream changes elsewhere in the files we touch, and
parses the files the series adds as Python."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from rebase_support import PKG, add_patches, make_rebase_world, make_release, release_files
from support import GIT_ENV, Cli, World

ENGINE = PKG + "engine.py"

# 1.3.0: merged_target's tail grows (+4 -2), a function appears after clean_target, conflict_target changes
EDITS = [
    (
        "engine.py",
        "def merged_target(x):\n    # upstream edits this comment line\n",
        "def merged_target(x, k=1):\n    # upstream edited this\n    # and it grew\n    # by two lines\n",
    ),
    (
        "engine.py",
        "def offset_target(x):",
        "def fresh_helper(x):\n    y = x + 2\n    return y\n\n\ndef offset_target(x):",
    ),
    ("engine.py", "f = x + 10", "f = x + 11"),
]


def _g(wt: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=wt, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, check=True
    ).stdout


def _series_at_new_release(world: World, cli: Cli) -> list[str]:
    """The series rebased onto 1.3.0, then a patch written at 1.3.0 into fresh_helper and a new module, the rebase
    history removed: the usual state after a rebase, reviewed with --from 1.2.0 --to 1.3.0."""
    add_patches(world, ["merged", "clean"])
    release = make_release(world, files=release_files(world, EDITS, rename_legacy=False, delete_old=False))
    root = ["--root", str(world.root)]
    r = cli(*root, "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3 and "stopped for review" in r.err, r.err  # the merged patch
    r = cli(*root, "-q", "rebase", "demo", "--publish")
    assert r.code == 0, r.err
    assert "# base: demo 1.3.0" in (world.series_dir / "series").read_text()
    r = cli(*root, "-q", "checkout", "demo")
    assert r.code == 0, r.err
    wt = world.root / "build" / "worktrees" / "demo"
    eng = wt / ENGINE
    eng.write_text(eng.read_text().replace("    y = x + 2\n", "    y = x + 2  # ours\n"))
    (wt / PKG / "helpers.py").write_text(
        "def helper_one(x):\n    return x\n\n\nclass Helper:\n    def go(self):\n        return 1\n"
    )
    _g(wt, "add", "-A")
    trailers = (
        "Overlay-Theme: other\nOverlay-Numerics: exact\nOverlay-Check: tests/test_demo.py::test_demo\n"
        "Upstream-Status: Pending\nOverlay-Flag: default\n"
    )
    _g(wt, "commit", "-q", "-m", "engine: note in fresh_helper\n\nA patch written at 1.3.0.\n\n" + trailers)
    r = cli(*root, "-q", "refresh", "demo")
    assert r.code == 0, r.err
    hist = world.root / "build" / "rebase-history"
    import shutil

    shutil.rmtree(hist, ignore_errors=True)
    return root


def test_review_reads_from_to_when_the_series_sits_on_to(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    root = _series_at_new_release(world, cli)
    html = tmp_path / "review.html"
    r = cli(*root, "review", "demo", "--from", "1.2.0", "--to", "1.3.0", "--json", "--html", str(html))
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["anchor"] == "new"
    sym = {s["symbol"]: s for s in data["symbols"]}
    merged = sym["merged_target"]
    assert (merged["status"], merged["added"], merged["removed"]) == ("changed", 4, 2), merged
    fresh = sym["fresh_helper"]
    assert (
        fresh["status"] == "added-upstream" and not fresh["flagged"] and "added upstream" in fresh["summary"]
    )
    # the added module is Python: its symbols, not "<module>" of a file that is not there
    assert {"helper_one", "Helper"} <= set(sym), sorted(sym)
    assert sym["Helper"]["status"] == "added-by-series"
    # HTML: old (1.2.0) on the left, new (1.3.0) on the right
    text = html.read_text()
    block = text[text.index('id="sym-' + ENGINE + '::merged_target"') :]
    block = block[: block.index("</details>")]
    assert block.index("1.2.0: " + ENGINE) < block.index("1.3.0: " + ENGINE)
    assert block.index("# and it grew") > block.index("1.3.0: " + ENGINE)
    left_cells = [c for c in block.split("<tr>") if "# and it grew" in c]
    assert left_cells and all(
        'class="code add"' in c for c in left_cells
    )  # new lines tinted as added on the right
    # badges name their file
    assert "engine.py::merged_target (changed)" in text and "helpers.py::Helper (added-by-series)" in text


def test_review_collapses_unchanged_and_shows_changes_elsewhere(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["merged", "clean", "offset"])
    release = make_release(world, files=release_files(world, EDITS, rename_legacy=False, delete_old=False))
    root = ["--root", str(world.root)]
    r = cli(*root, "review", "demo", "--from", "1.2.0", "--to", "1.3.0", "--to-url", release.as_uri())
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert "2 more symbols we patch are unchanged upstream" in r.out  # clean_target, offset_target
    assert not any("clean_target: unchanged" in line for line in lines)
    # conflict_target and fresh_helper changed upstream, outside the symbols the series patches
    also = next(line for line in lines if line.lstrip().startswith("also"))
    assert ENGINE in also and "conflict_target changed" in also and "fresh_helper added-upstream" in also
    data = json.loads((world.root / "build" / "reports" / "demo-review.json").read_text())
    other = {c["symbol"]: c["status"] for e in data["elsewhere"] for c in e["changes"]}
    assert other == {"conflict_target": "changed", "fresh_helper": "added-upstream"}
    assert data["unchanged"] == 2


def test_review_counts_moved_hunks_as_flagged(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["run"])
    release = make_release(world)  # Scheduler.run renamed to execute upstream
    root = ["--root", str(world.root)]
    html = tmp_path / "r.html"
    r = cli(
        *root,
        "review",
        "demo",
        "--from",
        "1.2.0",
        "--to",
        "1.3.0",
        "--to-url",
        release.as_uri(),
        "--html",
        str(html),
    )
    assert r.code == 0, r.err
    data = json.loads((world.root / "build" / "reports" / "demo-review.json").read_text())
    moved = [m for e in data["range_diff"] for m in e["moved_hunks"]]
    assert len(moved) == 1
    flagged_symbols = [s for s in data["symbols"] if s["flagged"]]
    assert data["flagged"] == len(flagged_symbols) + 1
    assert any(f.startswith("hunk moved in 0001") for f in data["flags"])
    assert f"{data['flagged']} flagged" in r.out.splitlines()[0]
    assert f"<b>{data['flagged']}</b>flagged" in html.read_text()
