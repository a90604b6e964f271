"""`overlay apply ENGINE` builds every pinned wheel (each Python tag), the primary printed last; older builds are
listed, or pruned with --prune; `--artifact` still builds one."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

from support import Cli, World, make_wheel

CP312 = "cp312-cp312-manylinux_2_34_x86_64"


def add_cp312_artifact(world: World) -> Path:
    """A second pinned wheel of the same release, for another Python tag (same package files)."""
    with zipfile.ZipFile(world.wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if ".dist-info/" not in n}
    other = make_wheel(world.wheel.with_name(f"demo_engine-1.2.0-{CP312}.whl"), files, tag=CP312)
    sha = hashlib.sha256(other.read_bytes()).hexdigest()
    text = world.manifest_text() + (
        f'\n[[upstream.artifacts]]\nfilename = "{other.name}"\nsha256 = "{sha}"\nurl = "{other.as_uri()}"\n'
    )
    (world.root / "overlays" / "demo.toml").write_text(text)
    return other


def test_apply_builds_every_pinned_wheel_primary_last(world2: World, cli: Cli) -> None:
    add_cp312_artifact(world2)
    r = cli("--root", str(world2.root), "apply", "demo")
    assert r.code == 0, r.err
    lines = r.out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(f"-{CP312}.whl") and lines[-1].endswith("-py3-none-any.whl")  # primary last
    for line in lines:
        with zipfile.ZipFile(line) as zf:
            prov = json.loads(next(zf.read(n) for n in zf.namelist() if n.endswith("overlay.json")))
        tags = Path(line).name.split("-", 2)[2]
        assert prov["upstream"]["artifact"]["filename"] == f"demo_engine-1.2.0-{tags}"
        with zipfile.ZipFile(line) as zf:
            assert b'prefix = "hi"' in zf.read("demo_pkg/core.py")
    assert (
        "wheel: [1/2] demo_engine-1.2.0-cp312" in r.err
        and "wheel: [2/2] demo_engine-1.2.0-py3-none-any" in r.err
    )
    state = json.loads((world2.root / "build" / "state" / "demo.json").read_text())
    assert state["wheel"] == lines[-1]

    one = cli("--root", str(world2.root), "-q", "apply", "demo", "--artifact", "primary", "--json")
    assert one.code == 0 and "wheels" not in json.loads(one.out)
    assert json.loads(one.out)["wheel"] == lines[-1]


def test_older_builds_are_listed_then_pruned(world2: World, cli: Cli) -> None:
    add_cp312_artifact(world2)
    first = cli("--root", str(world2.root), "-q", "apply", "demo", "--upto", "1", "--json")
    old = [w["wheel"] for w in json.loads(first.out)["wheels"]]
    r = cli("--root", str(world2.root), "apply", "demo", "--json")
    data = json.loads(r.out)
    assert sorted(data["stale"]) == sorted(old) and data["pruned"] == []
    assert f"older build kept: {Path(old[0]).name} (--prune removes it)" in r.err
    p = cli("--root", str(world2.root), "apply", "demo", "--prune", "--json")
    data = json.loads(p.out)
    assert sorted(data["pruned"]) == sorted(old) and data["stale"] == []
    left = sorted(x.name for x in (world2.root / "build" / "wheels" / "demo").iterdir())
    assert left == sorted(Path(w["wheel"]).name for w in data["wheels"])
