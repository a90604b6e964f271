from __future__ import annotations

from pathlib import Path

import pytest

from overlay.core.manifest import load_engine, load_manifest
from overlay.errors import ConfigError
from support import Cli, World

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("engine", "version", "root"),
    [("sglang", "0.5.23", "python"), ("exllamav3", "1.6.5", ""), ("mlx-lm", "0.32.2", "")],
)
def test_real_manifests_pin_version_hash_and_layout(engine: str, version: str, root: str) -> None:
    m = load_engine(REPO, engine)
    assert m.upstream.version == version
    assert m.upstream.package_root == root
    assert m.upstream.git.startswith("https://github.com/")
    for a in m.upstream.artifacts:
        assert len(a.sha256) == 64 and version in a.filename


def test_unknown_key_names_key_and_closest(world: World, cli: Cli) -> None:
    path = world.root / "overlays" / "demo.toml"
    path.write_text(path.read_text().replace('package-root = "python"', 'package_root = "python"'))
    with pytest.raises(
        ConfigError, match=r"unknown key upstream\.'package_root' \(did you mean 'package-root'\?\)"
    ):
        load_manifest(path)
    r = cli("--root", str(world.root), "lint", "demo")
    assert r.code == 2 and "package_root" in r.err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('sha256 = "', 'sha256 = "zz'), r"sha256 'zz[0-9a-f]+' is not 64 lower-case hex digits"),
        (
            ('commit = "', 'commit = "abc'),
            r"upstream.commit 'abc[0-9a-f]+' is not a full 40-hex git commit id",
        ),
        (('version = "1.2.0"', 'version = "1.3.0"'), r"is version 1.2.0, but upstream.version is 1.3.0"),
        (('name = "demo"', 'name = "other"'), r"engine.name 'other' differs from the file name 'demo'"),
        (('label = "ovl"', 'label = "O-V"'), r"series.label 'O-V'"),
        (('dir = "patches/demo"\n', ""), r"missing required key series.dir"),
        (("[series]", "[serie]"), r"unknown key 'serie' \(did you mean 'series'\?\)"),
        (('label = "ovl"', "label = 3"), r"series.label must be a str, got 3"),
    ],
)
def test_bad_manifests_are_refused_with_the_key_named(
    world: World, edit: tuple[str, str], message: str
) -> None:
    path = world.root / "overlays" / "demo.toml"
    path.write_text(path.read_text().replace(*edit, 1))
    with pytest.raises(ConfigError, match=message):
        load_manifest(path)


def test_unknown_engine_suggests_closest(world: World, cli: Cli) -> None:
    r = cli("--root", str(world.root), "apply", "dem")
    assert r.code == 2
    assert "unknown engine 'dem'" in r.err and "did you mean 'demo'" in r.err
