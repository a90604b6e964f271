"""`overlay pin ENGINE --commit SHA [--git URL]`: the commit's tree at package-root against the pinned wheel's Python
files, on real git repositories and a real wheel built in tmp_path (no network)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from overlay.core.manifest import load_engine
from overlay.core.series import load_engine_series
from overlay.fsutil import exclusive_lock
from overlay.stack.locks import lock_path
from overlay.upstream.pin import Difference, compare_trees
from support import Cli, CliResult, World, git, make_wheel

PKG = "python/demo_pkg/"
COMMENTED = "# the release this overlay is built on\n"


def unpinned(world: World) -> tuple[bytes, bytes]:
    """The manifest without upstream.commit (and a comment to keep), the series with `-` as its base commit and a
    comment; returns both files' bytes."""
    text = world.manifest_text().replace(f'commit = "{world.base_commit}"\n', "")
    text = text.replace("[upstream]\n", "[upstream]\n" + COMMENTED)
    manifest = world.root / "overlays" / "demo.toml"
    manifest.write_text(text)
    series = world.series_dir / "series"
    series.write_text("# base: demo 1.2.0 -\n# patches come here\n")
    return manifest.read_bytes(), series.read_bytes()


def pin(cli: Cli, world: World, commit: str, *extra: str) -> CliResult:
    return cli("--root", str(world.root), "pin", "demo", "--commit", commit, *extra)


def commit_all(world: World, subject: str) -> str:
    git(world.upstream, "add", "-A")
    git(world.upstream, "commit", "-q", "-m", subject)
    return git(world.upstream, "rev-parse", "HEAD")


def test_a_matching_commit_is_recorded_in_the_manifest_and_the_series_base(world: World, cli: Cli) -> None:
    unpinned(world)
    r = pin(cli, world, world.base_commit)
    assert r.code == 0, r.err
    assert (
        f"commit {world.base_commit} holds the 3 Python files of demo_engine-1.2.0-py3-none-any.whl" in r.out
    )
    manifest = load_engine(world.root, "demo")
    assert manifest.upstream.commit == world.base_commit
    text = (world.root / "overlays" / "demo.toml").read_text()
    assert COMMENTED in text and text.count("commit = ") == 1  # edited in place, the comment kept
    assert (
        world.series_dir / "series"
    ).read_text() == f"# base: demo 1.2.0 {world.base_commit}\n# patches come here\n"
    assert load_engine_series(world.root, manifest).base_commit == world.base_commit
    assert cli("--root", str(world.root), "lint", "demo").code == 0
    again = pin(cli, world, world.base_commit)
    assert again.code == 0 and "already recorded; nothing to write" in again.out


def test_a_commit_with_a_changed_python_file_is_refused_naming_it(world: World, cli: Cli) -> None:
    before = unpinned(world)
    changed = world.commit_change(
        PKG + "core.py", 'prefix = "hello"', 'prefix = "hi"', "core: shorter greeting"
    )
    r = pin(cli, world, changed)
    assert r.code == 5, r.err
    assert f"@{changed[:12]} is not the tree of demo_engine-1.2.0-py3-none-any.whl: 1 Python file(s)" in r.err
    assert "  python/demo_pkg/core.py: differs" in r.err and "util.py" not in r.err
    assert "nothing was written" in r.err
    assert (
        (world.root / "overlays" / "demo.toml").read_bytes(),
        (world.series_dir / "series").read_bytes(),
    ) == before


def test_a_commit_missing_a_file_names_every_difference(world: World, cli: Cli) -> None:
    before = unpinned(world)
    (world.upstream / PKG / "util.py").unlink()
    (world.upstream / PKG / "__init__.py").write_text("# changed\n")
    (world.upstream / PKG / "later.py").write_text("NEW = 1\n")  # a file the release does not have
    (world.upstream / "python" / "setup.py").write_text(
        "# not part of the wheel\n"
    )  # the package root: not shipped
    broken = commit_all(world, "later work")
    r = pin(cli, world, broken)
    assert r.code == 5, r.err
    listed = [line.strip() for line in r.err.splitlines() if line.startswith("  ")]
    assert listed == [
        "python/demo_pkg/__init__.py: differs",
        "python/demo_pkg/util.py: in the wheel, not in the commit",
        "python/demo_pkg/later.py: in the commit, not in the wheel",
    ]
    assert "3 Python file(s)" in r.err
    assert (
        (world.root / "overlays" / "demo.toml").read_bytes(),
        (world.series_dir / "series").read_bytes(),
    ) == before


def test_other_files_that_differ_are_information_only(world: World, cli: Cli) -> None:
    unpinned(world)
    (world.upstream / PKG / "native.so").write_bytes(b"rebuilt")
    (world.upstream / "README.md").write_text("outside the package root\n")
    other = commit_all(world, "rebuild the native part")
    r = pin(cli, world, other, "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["other_differences"] == [{"path": "python/demo_pkg/native.so", "kind": "differs"}]
    assert data["python_files"] == 3 and data["other_files"] == 1 and data["commit"] == other
    assert load_engine(world.root, "demo").upstream.commit == other
    subprocess.run(
        ["git", "rm", "-q", PKG + "native.so"], cwd=world.upstream, check=True, capture_output=True
    )
    gone = commit_all(world, "drop the native part")
    r = pin(cli, world, gone)
    assert r.code == 0, r.err
    assert (
        "NOTE python/demo_pkg/native.so: in the wheel, not in the commit (not Python: information only)"
        in r.out
    )


def test_dry_run_shows_the_result_and_writes_nothing(world: World, cli: Cli) -> None:
    before = unpinned(world)
    r = pin(cli, world, world.base_commit, "--dry-run")
    assert r.code == 0, r.err
    assert "would write patches/demo/series" in r.out and "would write overlays/demo.toml" in r.out
    assert f'commit = "{world.base_commit}"' in r.out and f"# base: demo 1.2.0 {world.base_commit}" in r.out
    assert (
        (world.root / "overlays" / "demo.toml").read_bytes(),
        (world.series_dir / "series").read_bytes(),
    ) == before
    assert not lock_path(world.root, "demo").exists()  # a dry run takes no lock


def test_git_url_is_recorded_and_checked(world: World, cli: Cli, tmp_path: Path) -> None:
    unpinned(world)
    fork = tmp_path / "fork"
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(world.upstream), str(fork)], check=True, capture_output=True
    )
    r = pin(cli, world, world.base_commit, "--git", str(fork))
    assert r.code == 0, r.err
    assert load_engine(world.root, "demo").upstream.git == str(fork)
    r = pin(cli, world, world.base_commit, "--git=--upload-pack=touch /tmp/x")
    assert r.code == 2 and "begins with '-'" in r.err


def test_bad_or_unknown_commits_are_usage_errors(world: World, cli: Cli) -> None:
    before = unpinned(world)
    r = pin(cli, world, "v1.2.0")
    assert r.code == 2 and "is not a full 40-hex git commit id" in r.err
    r = pin(cli, world, "0" * 40)
    assert r.code == 2 and f"commit {'0' * 40} is not in" in r.err
    assert (
        (world.root / "overlays" / "demo.toml").read_bytes(),
        (world.series_dir / "series").read_bytes(),
    ) == before


def test_pin_repairs_a_series_whose_base_commit_disagrees(world: World, cli: Cli) -> None:
    other = world.commit_change("README.md", "demo upstream", "demo upstream, later", "readme")
    (world.series_dir / "series").write_text(f"# base: demo 1.2.0 {other}\n")
    r = pin(cli, world, world.base_commit)
    assert r.code == 0, r.err
    assert (world.series_dir / "series").read_text() == f"# base: demo 1.2.0 {world.base_commit}\n"
    assert "wrote overlays/demo.toml" not in r.out  # the manifest already had it: only series changed


def test_pin_waits_for_the_engine_lock_and_refuses_during_a_rebase(world: World, cli: Cli) -> None:
    before = unpinned(world)
    with exclusive_lock(lock_path(world.root, "demo"), command="overlay refresh demo"):
        r = pin(cli, world, world.base_commit)
    assert r.code == 2 and "overlay refresh demo" in r.err
    state = world.root / "build" / "rebase" / "demo"
    state.mkdir(parents=True)
    (state / "state.json").write_text("{}")
    r = pin(cli, world, world.base_commit)
    assert r.code == 2 and "a rebase of demo is in progress" in r.err
    assert (
        (world.root / "overlays" / "demo.toml").read_bytes(),
        (world.series_dir / "series").read_bytes(),
    ) == before


def test_compare_trees_kinds_without_git() -> None:
    from overlay.git.objects import blob_id
    from overlay.upstream.pin import TreeEntry

    files = {"pkg/a.py": b"a\n", "pkg/b.py": b"b\n", "pkg/lib.so": b"\0", "pkg/link.py": b"x\n"}
    tree = {
        "pkg/a.py": TreeEntry("100644", "blob", blob_id(b"a\n")),
        "pkg/b.py": TreeEntry("100755", "blob", blob_id(b"B\n")),
        "pkg/link.py": TreeEntry("120000", "blob", blob_id(b"x\n")),
        "pkg/new.py": TreeEntry("100644", "blob", blob_id(b"")),
        "setup.py": TreeEntry("100644", "blob", blob_id(b"")),
    }
    python, other = compare_trees(files, tree)
    assert python == [
        Difference("pkg/b.py", "differs"),
        Difference("pkg/link.py", "not-a-file"),
        Difference("pkg/new.py", "extra"),
    ]
    assert other == [Difference("pkg/lib.so", "missing")]


def test_allow_members_reaches_pin_rebase_review_and_the_surface_check(world: World, cli: Cli) -> None:
    """A wheel with its own .data folder, admitted by upstream.allow-members: every reader of the pinned and the target
    wheel (pin, rebase, review, check's surface) must take the manifest's allowance, not refuse the wheel."""
    from overlay.check.run import _surface
    from rebase_support import make_release

    pkg = world.upstream / "python" / "demo_pkg"
    files = {f"demo_pkg/{p.name}": p.read_bytes() for p in sorted(pkg.iterdir())}
    data = {"demo_engine-1.2.0.data/scripts/demo-run": b"#!/bin/sh\necho hi\n"}
    world.wheel.unlink()
    make_wheel(world.wheel, {**files, **data})
    allow = 'package-root = "python"\nallow-members = ["data"]\n'
    manifest_path = world.root / "overlays" / "demo.toml"
    manifest_path.write_text(world.manifest_text().replace('package-root = "python"\n', allow))
    root = ["--root", str(world.root)]
    r = pin(cli, world, world.base_commit, "--json")
    assert r.code == 0, r.err
    assert (
        json.loads(r.out)["python_files"] == 3
    )  # the .data member is not at a repository path: not compared
    newer = make_release(world, "1.3.0", {**files, "demo_engine-1.3.0.data/scripts/demo-run": b"#!/bin/sh\n"})
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", newer.as_uri(), "--dry-run")
    assert r.code == 0, r.err
    r = cli(*root, "review", "demo", "--from", "1.2.0", "--to", "1.3.0", "--to-url", newer.as_uri())
    assert r.code == 0, r.err
    manifest = load_engine(world.root, "demo")
    assert "modules" in _surface(world.wheel, manifest)
    manifest_path.write_text(world.manifest_text())  # without the allowance the same wheel is refused
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", newer.as_uri(), "--dry-run")
    assert r.code == 5 and ".data" in r.err, r.err
