"""Hardening, issue 11 classes 2 and 3: inputs are read without following links out of the root, and names never
become paths unchecked. Every hostile input is built for real in tmp_path (symlinks, folders, manifests)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from overlay.core.inputs import check_name, inside_root, read_inside
from overlay.core.manifest import Artifact, load_engine, load_manifest
from overlay.core.series import load_series, parse_patch, parse_series_file
from overlay.errors import ConfigError, IntegrityError, UsageError
from support import Cli, World


def _outside(world: World) -> Path:
    """A folder next to the overlay repository (outside its root), holding a copy of the real series."""
    out = world.root.parent / "elsewhere"
    out.mkdir(exist_ok=True)
    for p in world.series_dir.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    return out


def _tree_hashes(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ------------------------------------------------------------------ class 2: links out of the root


def test_series_file_linking_out_is_refused_by_lint_and_apply(world2: World, cli: Cli) -> None:
    outside = _outside(world2)
    series = world2.series_dir / "series"
    series.unlink()
    series.symlink_to(outside / "series")
    for argv in (("lint", "demo"), ("apply", "demo", "--offline"), ("checkout", "demo"), ("list",)):
        r = cli("--root", str(world2.root), *argv)
        assert r.code == 5, (argv, r.err)
        assert (
            str(series) in r.err
            and str(outside / "series") in r.err
            and "outside the overlay repository" in r.err
        )
    assert not (world2.root / "build" / "wheels").exists()


def test_patch_file_linking_out_is_refused(world2: World, cli: Cli) -> None:
    outside = _outside(world2)
    name = sorted(p.name for p in world2.series_dir.glob("*.patch"))[0]
    patch = world2.series_dir / name
    patch.unlink()
    patch.symlink_to(outside / name)
    for argv in (("lint", "demo"), ("apply", "demo", "--offline")):
        r = cli("--root", str(world2.root), *argv)
        assert r.code == 5, (argv, r.err)
        assert name in r.err and str(outside / name) in r.err
    with pytest.raises(IntegrityError, match="patch file"):
        parse_patch(patch)  # the default root is the patch's own folder


def test_series_folder_linking_out_is_refused(world2: World, cli: Cli) -> None:
    outside = _outside(world2)
    for p in list(world2.series_dir.iterdir()):
        p.unlink()
    world2.series_dir.rmdir()
    world2.series_dir.symlink_to(outside, target_is_directory=True)
    for argv in (
        ("lint", "demo"),
        ("apply", "demo", "--offline"),
        ("checkout", "demo"),
        ("review", "demo", "--from", "1.2.0", "--to", "1.3.0", "--offline"),
    ):
        r = cli("--root", str(world2.root), *argv)
        assert r.code == 5, (argv, r.err)
        assert "series.dir" in r.err and str(outside) in r.err


def test_manifest_linking_out_is_refused(world2: World, cli: Cli) -> None:
    manifest = world2.root / "overlays" / "demo.toml"
    outside = world2.root.parent / "demo.toml"
    outside.write_bytes(manifest.read_bytes())
    manifest.unlink()
    manifest.symlink_to(outside)
    for argv in (
        ("lint",),
        ("lint", "demo"),
        ("apply", "demo", "--offline"),
        ("fetch", "demo", "--offline"),
        ("list",),
        ("rebase", "demo", "--abort"),
    ):
        r = cli("--root", str(world2.root), *argv)
        assert r.code == 5, (argv, r.err)
        assert "manifest" in r.err and str(outside) in r.err
    with pytest.raises(IntegrityError):
        load_manifest(manifest)  # the default root: the folder holding overlays/


def test_links_that_stay_inside_the_root_are_followed(world2: World, cli: Cli) -> None:
    shared = world2.root / "patches" / "shared-demo"
    world2.series_dir.rename(shared)
    world2.series_dir.symlink_to("shared-demo", target_is_directory=True)
    manifest = world2.root / "overlays" / "demo.toml"
    kept = world2.root / "pins" / "demo.toml"
    kept.parent.mkdir()
    manifest.rename(kept)
    manifest.symlink_to(Path("..") / "pins" / "demo.toml")
    assert len(load_series(world2.series_dir, root=world2.root).patches) == 2
    assert load_engine(world2.root, "demo").name == "demo"
    r = cli("--root", str(world2.root), "list", "--json")
    assert r.code == 0, r.err
    assert '"patches": 2' in r.out


def test_a_non_regular_input_is_a_config_error(world2: World) -> None:
    series = world2.series_dir / "series"
    series.unlink()
    series.mkdir()
    with pytest.raises(ConfigError, match="is a folder"):
        parse_series_file(series)


def test_read_inside_refuses_a_link_chain_that_leaves(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret").write_text("outside\n")
    (root / "hop").symlink_to(tmp_path / "secret")
    (root / "file").symlink_to("hop")  # inside -> inside -> outside
    with pytest.raises(IntegrityError, match="through the symlink") as exc:
        read_inside(root, root / "file", what="series file")
    assert str(tmp_path / "secret") in exc.value.message
    (root / "ok").write_text("inside\n")
    (root / "link").symlink_to("ok")
    assert read_inside(root, root / "link", what="series file") == b"inside\n"
    assert inside_root(root, root / "link", what="x") == (root / "ok").resolve()


def test_manifest_paths_must_stay_inside(world2: World, cli: Cli) -> None:
    manifest = world2.root / "overlays" / "demo.toml"
    text = manifest.read_text()
    for bad in ("../elsewhere", "/etc", "patches/../../x", "patches\\\\demo"):
        manifest.write_text(text.replace('dir = "patches/demo"', f'dir = "{bad}"'))
        r = cli("--root", str(world2.root), "lint", "demo")
        assert r.code == 2, (bad, r.err)
        assert "series.dir" in r.err
    manifest.write_text(text + '\n[runtime]\npython-path = ["../site"]\n')
    with pytest.raises(ConfigError, match="runtime.python-path entry '../site' contains '..'"):
        load_engine(world2.root, "demo")
    # an entry that is a symlink leading out is refused where it is used
    (world2.root.parent / "site").mkdir()
    (world2.root / "site").symlink_to(world2.root.parent / "site", target_is_directory=True)
    manifest.write_text(text + '\n[runtime]\npython-path = ["site"]\n')
    from overlay.check.envs import runtime_env

    with pytest.raises(IntegrityError, match="python-path"):
        runtime_env(world2.root, load_engine(world2.root, "demo"))


# ------------------------------------------------------------------ class 3: names never become paths


@pytest.mark.parametrize("bad", ["../overlays/demo", "a/b", "a\\b", "..", "-demo", "", "de\x00mo", "x..y"])
def test_check_name_refuses(bad: str) -> None:
    with pytest.raises(UsageError, match="engine name"):
        check_name(bad, what="engine name", error=UsageError)


def test_rebase_abort_with_a_path_as_engine_deletes_nothing(world2: World, cli: Cli) -> None:
    # what `overlay rebase ../overlays/mlx-lm --abort` deleted: build/rebase/../overlays/ENGINE
    victim = world2.root / "build" / "overlays" / "demo"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("precious\n")
    before = _tree_hashes(world2.root)
    r = cli("--root", str(world2.root), "rebase", "../overlays/demo", "--abort")
    assert r.code == 2
    assert "engine name '../overlays/demo'" in r.err and "path separator" in r.err
    assert (victim / "keep.txt").read_text() == "precious\n"
    assert _tree_hashes(world2.root) == before


@pytest.mark.parametrize("engine", ["../overlays/demo", "-demo", "demo/../demo", "de\\mo"])
def test_every_command_refuses_a_path_as_engine(world2: World, cli: Cli, engine: str) -> None:
    before = _tree_hashes(world2.root)
    for argv in (
        ("lint",),
        ("apply", "--offline"),
        ("fetch", "--offline"),
        ("checkout",),
        ("refresh",),
        ("rebase",),
        ("rebase", "--abort"),
        ("rebase", "--continue"),
        ("rebase", "--to", "1.3.0", "--offline"),
        ("review", "--from", "1.2.0", "--to", "1.3.0", "--offline"),
        ("check",),
    ):
        r = cli(
            "--root", str(world2.root), *argv, "--", engine
        )  # `--`: argparse itself refuses '-demo' otherwise
        assert r.code == 2, (argv, r.err)
        assert f"engine name {engine!r}" in r.err, (argv, r.err)
    assert _tree_hashes(world2.root) == before


def test_artifact_names_are_plain(world2: World, cli: Cli) -> None:
    manifest = world2.root / "overlays" / "demo.toml"
    text = manifest.read_text()
    for bad in (
        "../demo_engine-1.2.0-py3-none-any.whl",
        "sub\\\\demo_engine-1.2.0-py3-none-any.whl",
        "demo_engine-1.2.0-py3-none-any.whl/..",
        "-demo_engine-1.2.0-py3-none-any.whl",
    ):
        manifest.write_text(text.replace(f'filename = "{world2.wheel.name}"', f'filename = "{bad}"'))
        r = cli("--root", str(world2.root), "fetch", "demo", "--offline")
        assert r.code == 2, (bad, r.err)
        assert "filename" in r.err
    manifest.write_text(text)
    r = cli("--root", str(world2.root), "apply", "demo", "--offline", "--artifact", "../../etc/passwd")
    assert r.code == 2 and "--artifact '../../etc/passwd'" in r.err
    with pytest.raises(ConfigError, match="artifact file name '..'"):
        Artifact(filename="..", sha256="0" * 64)  # e.g. the last part of a `--url` ending in /..


def test_patch_names_from_series_are_plain(world2: World, cli: Cli) -> None:
    series = world2.series_dir / "series"
    text = series.read_text()
    first = text.splitlines()[1]
    for bad in ("../" + first, "0001-a..b.patch", "sub/" + first, "-0001-x.patch"):
        series.write_text(text.replace(first, bad))
        r = cli("--root", str(world2.root), "lint", "demo")
        assert r.code == 2, (bad, r.err)
        assert repr(bad) in r.err and "series:2" in r.err


def test_git_url_beginning_with_dash_is_refused(world2: World, cli: Cli, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    r = cli(
        "--root",
        str(world2.root),
        "apply",
        "demo",
        "--source",
        "git",
        f"--git-url=--upload-pack=touch {marker}",
    )
    assert r.code == 2 and "--git-url" in r.err and "begins with '-'" in r.err
    assert not marker.exists()
    manifest = world2.root / "overlays" / "demo.toml"
    manifest.write_text(manifest.read_text().replace(f'git = "{world2.upstream}"', f'git = "-u{marker}"'))
    r = cli("--root", str(world2.root), "lint", "demo")
    assert r.code == 2 and "upstream.git" in r.err
