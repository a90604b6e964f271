"""overlay rebase stops for review before publishing when a patch merged, a hunk moved, an Overlay-Requires broke, or
the target is older than the pin; --publish publishes it, --abort gives it up, --undo takes back the last publish
byte for byte."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rebase_support import add_patches, make_rebase_world, make_release, release_files
from support import Cli, World


def _tree(world: World) -> dict[str, str]:
    files = [world.root / "overlays" / "demo.toml", *sorted(world.series_dir.iterdir())]
    return {p.relative_to(world.root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_a_merged_patch_stops_for_review_and_abort_gives_it_up(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["clean", "merged"])
    before = _tree(world)
    release = make_release(world)
    root = ["--root", str(world.root)]
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3, r.err
    assert "rebase demo 1.2.0 -> 1.3.0: review" in r.out and "merged" in r.out  # the table
    assert "REVIEW 1 patch resolved by a 3-way merge" in r.out
    assert (
        "overlay lint demo" in r.out
        and "overlay check demo" in r.out
        and "overlay rebase demo --publish" in r.out
    )
    assert _tree(world) == before  # nothing published
    report = json.loads((world.root / "build" / "reports" / "demo-rebase.json").read_text())
    assert report["status"] == "review" and report["review"][0].startswith(
        "1 patch resolved by a 3-way merge"
    )
    r = cli(*root, "rebase", "demo")  # the status: still the review stop
    assert r.code == 3 and ": review" in r.out
    r = cli(*root, "rebase", "demo", "--continue")
    assert r.code == 2 and "--publish" in r.err
    r = cli(*root, "rebase", "demo", "--abort")
    assert r.code == 0, r.err
    assert "no rebase" not in r.err and "aborted" in r.out
    assert _tree(world) == before
    assert not (world.root / "build" / "rebase" / "demo").exists()


def test_publish_then_undo_restores_every_byte(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["util", "merged", "upstreamed"])
    (world.series_dir / "DROPPED").write_text("# an old ledger\n")
    before = {p.name: p.read_bytes() for p in world.series_dir.iterdir()}
    manifest = (world.root / "overlays" / "demo.toml").read_bytes()
    release = make_release(world)
    root = ["--root", str(world.root)]
    assert cli(*root, "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri()).code == 3
    r = cli(*root, "rebase", "demo", "--publish")
    assert r.code == 0, r.err
    assert "published" in r.out
    assert (world.series_dir / "series").read_text().startswith("# base: demo 1.3.0")
    assert "upstreamed" in (world.series_dir / "DROPPED").read_text()
    r = cli(*root, "rebase", "demo", "--undo")
    assert r.code == 0, r.err
    assert "pinned at 1.2.0 again" in r.out
    assert {p.name: p.read_bytes() for p in world.series_dir.iterdir()} == before
    assert (world.root / "overlays" / "demo.toml").read_bytes() == manifest
    r = cli(*root, "rebase", "demo", "--undo")
    assert r.code == 2 and "no published rebase of demo to undo" in r.err


def test_undo_refuses_when_the_series_changed_since_the_publish(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["util", "clean"])
    release = make_release(world)
    root = ["--root", str(world.root)]
    assert (
        cli(*root, "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri()).code == 0
    )  # clean: published
    series = world.series_dir / "series"
    series.write_text(series.read_text() + "# edited after the publish\n")
    r = cli(*root, "rebase", "demo", "--undo")
    assert r.code == 2 and "changed since the rebase 1.2.0 -> 1.3.0 was published" in r.err
    assert series.read_text().endswith("# edited after the publish\n")


def test_a_target_older_than_the_pin_stops_for_review(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["util", "clean"])
    before = _tree(world)
    older = make_release(
        world, "1.1.0", files=release_files(world, [], rename_legacy=False, delete_old=False)
    )
    root = ["--root", str(world.root)]
    r = cli(*root, "rebase", "demo", "--to", "1.1.0", "--url", older.as_uri())
    assert r.code == 3, r.err
    assert "REVIEW the target 1.1.0 is older than the pin 1.2.0" in r.out
    assert _tree(world) == before
    r = cli(*root, "rebase", "demo", "--publish")
    assert r.code == 0, r.err
    assert (world.series_dir / "series").read_text().startswith("# base: demo 1.1.0")
