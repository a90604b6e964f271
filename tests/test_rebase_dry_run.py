"""overlay rebase --dry-run tells a patch's own conflict from one inherited from an earlier conflicting patch."""

from __future__ import annotations

import json
from pathlib import Path

from rebase_support import PKG, make_rebase_world, make_release
from support import Cli


def test_dry_run_says_which_conflicts_are_inherited(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    # 0001 changes the line upstream changed too (its own conflict); 0002 and 0003 change the lines right after it,
    # written on top of 0001: they conflict only while 0001 is left out
    world.commit_change(PKG + "engine.py", "f = x + 10", "f = x + 12", "engine: conflict_target adds twelve")
    world.commit_change(
        PKG + "engine.py",
        "    f = x + 12\n    return f\n",
        "    f = x + 12\n    return f + 0\n",
        "engine: conflict_target returns a copy",
    )
    world.commit_change(
        PKG + "engine.py",
        "    return f + 0\n",
        "    return f + 0  # ours\n",
        "engine: conflict_target says whose",
    )
    world.export_series()
    release = make_release(world)
    root = ["--root", str(world.root)]
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri(), "--dry-run", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    kinds = [(p["name"][:4], p["class"], p["conflict_kind"]) for p in data["patches"]]
    assert kinds == [
        ("0001", "conflict", "own"),
        ("0002", "conflict", "inherited"),
        ("0003", "conflict", "inherited"),
    ]
    assert data["conflicts"] == {"own": 1, "inherited": 2}
    second = data["patches"][1]
    assert second["inherited_from"] == ["0001-engine-conflict_target-adds-twelve.patch"]
    assert "inherited: offset once 0001 is resolved" in second["detail"]
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri(), "--dry-run")
    assert "of the conflicts 1 are the patches' own, 2 inherited" in r.out
    assert "inherited" in next(line for line in r.out.splitlines() if line.startswith("0002"))
    assert not (world.root / "build" / "rebase" / "demo").exists()  # a dry run writes no state
