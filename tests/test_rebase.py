"""overlay rebase on synthetic upstreams: every patch class, stop/continue/skip, abort leaving no trace, publishing."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from overlay.core.manifest import load_engine
from overlay.core.series import load_series
from rebase_support import PKG, add_patches, make_rebase_world, make_release
from support import Cli, World, git


@pytest.fixture
def rworld(tmp_path: Path) -> World:
    return make_rebase_world(tmp_path)


def classes(report: Path) -> dict[str, tuple[str, str]]:
    data = json.loads(report.read_text())
    return {p["name"][5:]: (p["class"], p["resolution"]) for p in data["patches"]}


def tree_snapshot(root: Path, *, skip: tuple[str, ...] = ("build/cache",)) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if any(rel == s or rel.startswith(s + "/") for s in skip) or not p.is_file():
            continue
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_rebase_classifies_and_publishes(rworld: World, cli: Cli) -> None:
    names = add_patches(rworld, ["util", "clean", "offset", "merged", "upstreamed", "equivalent"])
    manifest_path = rworld.root / "overlays" / "demo.toml"
    manifest_path.write_text(
        "# the demo engine (a comment the rebase must keep)\n" + manifest_path.read_text()
    )
    util_bytes = (rworld.series_dir / names[0]).read_bytes()
    release = make_release(rworld)
    r = cli("--root", str(rworld.root), "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3, r.err  # a merged patch: stopped for review before publishing
    assert "stopped for review" in r.err and "overlay rebase demo --publish" in r.out
    r = cli("--root", str(rworld.root), "rebase", "demo", "--publish")
    assert r.code == 0, r.err
    assert "published" in r.out
    report = rworld.root / "build" / "reports" / "demo-rebase.json"
    got = classes(report)
    assert got == {
        "util-double-by-addition.patch": ("clean", "auto"),
        "engine-clean_target-adds-the-other-way-round.patch": ("clean", "auto"),
        "engine-offset_target-subtracts-two.patch": ("offset", "auto"),
        "engine-merged_target-squares-with-pow.patch": ("merged", "auto"),
        "engine-upstreamed_target-commutes.patch": ("upstreamed", "auto"),
        "engine-equivalent_target-avoids-the-mutable-default.patch": ("upstreamed", "auto"),
    }
    data = json.loads(report.read_text())
    assert data["version"] == 1 and data["status"] == "published"
    offset = next(p for p in data["patches"] if p["class"] == "offset")
    assert offset["offsets"][0]["offset"] == 4 and offset["moved_hunks"] == []
    equivalent = next(p for p in data["patches"] if "equivalent" in p["name"])
    assert "3-way merge leaves no change" in equivalent["detail"]
    # the series: upstreamed patches gone, the rest renumbered; an unchanged diff keeps its bytes
    series = load_series(rworld.series_dir)
    assert series.base_version == "1.3.0" and series.base_commit is None
    assert [p.name for p in series.patches] == [names[0], names[1], names[2], names[3]]
    assert (rworld.series_dir / names[0]).read_bytes() == util_bytes
    assert sorted(p.name for p in rworld.series_dir.glob("*.patch")) == list(series.names)
    ledger = (rworld.series_dir / "DROPPED").read_text()
    assert "patch: 0005-engine-upstreamed_target-commutes.patch" in ledger
    assert "upstream: 1.3.0" in ledger and "reason: upstreamed: reverse-applies on 1.3.0" in ledger
    assert "patch: 0006-engine-equivalent_target-avoids-the-mutable-default.patch" in ledger
    # the pin: values edited in place, comments kept, commit dropped with a note
    text = manifest_path.read_text()
    assert text.startswith("# the demo engine (a comment the rebase must keep)\n")
    m = load_engine(rworld.root, "demo")
    assert m.upstream.version == "1.3.0" and m.upstream.tag == "v1.3.0" and m.upstream.commit is None
    assert m.upstream.primary.filename == release.name
    assert m.upstream.primary.sha256 == hashlib.sha256(release.read_bytes()).hexdigest()
    assert m.upstream.primary.url == release.as_uri()
    assert f"# commit: unknown for 1.3.0; `overlay rebase` dropped {rworld.base_commit}" in text
    # the result is a valid series at the new pin: lint, checkout and an unchanged refresh
    assert cli("--root", str(rworld.root), "lint", "demo").code == 0
    r = cli("--root", str(rworld.root), "-q", "checkout", "demo", "--json")
    assert (
        r.code == 0 and json.loads(r.out)["base"] == data["bases"]["new"]
    )  # the same reproducible base commit
    before = tree_snapshot(rworld.series_dir)
    r = cli("--root", str(rworld.root), "refresh", "demo")
    assert r.code == 0 and "nothing to do" in r.out and tree_snapshot(rworld.series_dir) == before
    assert not (rworld.root / "build" / "rebase" / "demo").exists()
    assert (rworld.root / "build" / "rebase-history" / "demo" / "1.2.0-to-1.3.0" / "old" / "series").is_file()


def _resolve_conflict(repo: Path, path: str, replacement: str) -> None:
    target = repo / path
    text = target.read_text()
    new, n = re.subn(r"<<<<<<< [^\n]*\n.*?>>>>>>> [^\n]*\n", replacement, text, flags=re.DOTALL)
    assert n == 1
    target.write_text(new)


def test_conflict_stops_then_continue_publishes(rworld: World, cli: Cli) -> None:
    add_patches(rworld, ["util", "conflict", "clean"])
    release = make_release(rworld)
    root = ["--root", str(rworld.root)]
    pinned_base = json.loads(cli(*root, "-q", "checkout", "demo", "--json").out)["base"]
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3
    assert (
        json.loads((rworld.root / "build" / "reports" / "demo-rebase.json").read_text())["bases"]["old"]
        == pinned_base
    )
    assert "rebase stopped at 0002-engine-conflict_target-adds-twelve.patch (conflict)" in r.err
    assert "--continue" in r.err and "--abort" in r.err
    repo = rworld.root / "build" / "rebase" / "demo" / "repo"
    engine = (repo / PKG / "engine.py").read_text()
    assert "<<<<<<< HEAD" in engine and "f = x + 11" in engine and "f = x + 12" in engine
    data = json.loads((rworld.root / "build" / "reports" / "demo-rebase.json").read_text())
    assert data["status"] == "stopped" and data["stopped"]["paths"] == [PKG + "engine.py"]
    assert [p["resolution"] for p in data["patches"]] == ["auto", "pending", "not reached"]
    r = cli(*root, "rebase", "demo")  # where it stands
    assert r.code == 3 and "STOPPED" in r.out and "not reached" not in r.out and "pending" in r.out
    # nothing published yet, and a second rebase is refused
    assert load_engine(rworld.root, "demo").upstream.version == "1.2.0"
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 2 and "already in progress" in r.err
    # --continue with the markers still there is refused, naming the file and line
    r = cli(*root, "rebase", "demo", "--continue")
    assert r.code == 3 and re.search(r"engine\.py:\d+", r.err)
    _resolve_conflict(repo, PKG + "engine.py", "    f = x + 11 + 1\n")
    r = cli(*root, "rebase", "demo", "--continue")
    assert r.code == 0, r.err
    assert classes(rworld.root / "build" / "reports" / "demo-rebase.json")[
        "engine-conflict_target-adds-twelve.patch"
    ] == ("conflict", "user")
    patch = (rworld.series_dir / "0002-engine-conflict_target-adds-twelve.patch").read_text()
    assert "-    f = x + 11\n+    f = x + 11 + 1\n" in patch
    assert (
        "Overlay-Numerics: exact" in patch and "Subject: [PATCH] engine: conflict_target adds twelve" in patch
    )
    assert cli(*root, "lint", "demo").code == 0


def test_abort_leaves_no_trace(rworld: World, cli: Cli) -> None:
    add_patches(rworld, ["clean", "conflict"])
    release = make_release(rworld)
    root = ["--root", str(rworld.root)]
    assert cli(*root, "-q", "checkout", "demo").code == 0  # a checkout worktree in sync with the series
    previous = rworld.root / "build" / "reports" / "demo-rebase.json"
    previous.parent.mkdir(parents=True, exist_ok=True)
    previous.write_text('{"version": 1, "note": "an older report"}\n')
    before = tree_snapshot(rworld.root)
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3
    repo = rworld.root / "build" / "rebase" / "demo" / "repo"
    (repo / PKG / "engine.py").write_text("half-way through a resolution\n")
    r = cli(*root, "rebase", "demo", "--abort")
    assert r.code == 0, r.err
    assert (
        tree_snapshot(rworld.root) == before
    )  # patches/, overlays/, the worktree, the old report: byte for byte
    assert not (rworld.root / "build" / "rebase" / "demo").exists()
    r = cli(*root, "rebase", "demo", "--abort")
    assert r.code == 2 and "no rebase of demo is in progress" in r.err


def test_obsolete_names_the_rename_and_skip_drops(rworld: World, cli: Cli) -> None:
    add_patches(rworld, ["renamed", "gone", "util"])
    release = make_release(rworld)
    root = ["--root", str(rworld.root)]
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3
    assert f"{PKG}legacy.py was renamed to {PKG}compat.py upstream (similarity" in r.out
    repo = rworld.root / "build" / "rebase" / "demo" / "repo"
    assert "s = b + a" in (repo / PKG / "compat.py").read_text()  # git carried the change over, staged
    r = cli(*root, "rebase", "demo", "--continue")
    assert r.code == 3 and f"{PKG}old.py no longer exists in 1.3.0 (no rename detected)" in r.out
    r = cli(*root, "rebase", "demo", "--skip")
    assert r.code == 0, r.err
    got = classes(rworld.root / "build" / "reports" / "demo-rebase.json")
    assert got == {
        "legacy-sum-the-other-way-round.patch": ("obsolete", "user"),
        "old-old_api-adds-zero.patch": ("obsolete", "skipped"),
        "util-double-by-addition.patch": ("clean", "auto"),
    }
    series = load_series(rworld.series_dir)
    assert series.names == ("0001-legacy-sum-the-other-way-round.patch", "0002-util-double-by-addition.patch")
    assert [fd.path for fd in series.patches[0].files] == [PKG + "compat.py"]
    ledger = (rworld.series_dir / "DROPPED").read_text()
    assert "patch: 0002-old-old_api-adds-zero.patch" in ledger and "skipped by the user" in ledger


def test_dry_run_writes_nothing(rworld: World, cli: Cli) -> None:
    add_patches(rworld, ["clean", "conflict", "renamed"])
    release = make_release(rworld)
    before = tree_snapshot(rworld.root)
    r = cli(
        "--root", str(rworld.root), "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri(), "--dry-run"
    )
    assert r.code == 0, r.err
    assert "dry-run" in r.out and "conflict" in r.out and "obsolete" in r.out and "clean" in r.out
    assert tree_snapshot(rworld.root, skip=("build",)) == {
        k: v for k, v in before.items() if not k.startswith("build/")
    }
    assert not (rworld.root / "build" / "rebase" / "demo").exists()


def test_refusals(rworld: World, cli: Cli) -> None:
    add_patches(rworld, ["clean"])
    release = make_release(rworld)
    root = ["--root", str(rworld.root)]
    r = cli(*root, "rebase", "demo", "--to", "1.2.0")
    assert r.code == 2 and "already pinned at 1.2.0" in r.err
    r = cli(*root, "rebase", "demo", "--continue")
    assert r.code == 2 and "no rebase of demo is in progress" in r.err
    r = cli(*root, "rebase", "demo", "--to", "1.3.0")
    assert r.code == 2 and "pass --url" in r.err  # the pin is a direct url: the index cannot find 1.3.0
    r = cli(*root, "rebase", "demo", "--to", "1.4.0", "--url", release.as_uri())
    assert r.code == 5 and "not demo-engine 1.4.0" in r.err
    # a checkout worktree with work refresh has not written back
    wt = Path(cli(*root, "-q", "checkout", "demo").out.strip())
    (wt / PKG / "util.py").write_text("def double(x):\n    return x * 2\n")
    git(wt, "commit", "-qam", "util: unrefreshed work")
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 2 and "not written back" in r.err and "--force" in r.err
    r = cli(*root, "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri(), "--force")
    assert r.code == 0, r.err


def test_continue_refuses_a_series_changed_meanwhile(rworld: World, cli: Cli) -> None:
    add_patches(rworld, ["conflict"])
    release = make_release(rworld)
    root = ["--root", str(rworld.root)]
    assert cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri()).code == 3
    series = rworld.series_dir / "series"
    series.write_text(series.read_text() + "# a comment added meanwhile\n")
    r = cli(*root, "rebase", "demo", "--skip")
    assert r.code == 2 and "changed while the rebase" in r.err and "--abort" in r.err


def test_a_user_commit_counts_as_the_resolution(rworld: World, cli: Cli) -> None:
    add_patches(rworld, ["conflict"])
    release = make_release(rworld)
    root = ["--root", str(rworld.root)]
    assert cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri()).code == 3
    repo = rworld.root / "build" / "rebase" / "demo" / "repo"
    _resolve_conflict(repo, PKG + "engine.py", "    f = x + 13\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "my own message")
    assert cli(*root, "rebase", "demo", "--continue").code == 0
    patch = (rworld.series_dir / "0001-engine-conflict_target-adds-twelve.patch").read_text()
    assert "+    f = x + 13" in patch and "my own message" not in patch  # the patch keeps its message


def test_continue_after_an_interrupted_run(rworld: World, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import overlay.upstream.rebase.run as rb

    add_patches(rworld, ["util", "clean"])
    release = make_release(rworld)
    from overlay.upstream.replay import classify as real

    interrupted: list[int] = []

    def interrupt_once(ws, index, patch, **kw):  # type: ignore[no-untyped-def]
        if index == 1 and not interrupted:
            interrupted.append(index)
            (ws.repo / PKG / "engine.py").write_text("half-made\n")
            raise KeyboardInterrupt
        return real(ws, index, patch, **kw)

    monkeypatch.setattr(rb, "classify", interrupt_once)
    root = ["--root", str(rworld.root)]
    assert cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri()).code == 130
    r = cli(*root, "rebase", "demo", "--skip")
    assert r.code == 2 and "nothing to skip" in r.err
    r = cli(*root, "rebase", "demo", "--continue")
    assert r.code == 0, r.err
    assert [c for c, _r in classes(rworld.root / "build" / "reports" / "demo-rebase.json").values()] == [
        "clean",
        "clean",
    ]
    assert cli(*root, "lint", "demo").code == 0


def test_an_empty_series_moves_the_pin_only(rworld: World, cli: Cli) -> None:
    release = make_release(rworld)
    r = cli("--root", str(rworld.root), "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 0, r.err
    assert (rworld.series_dir / "series").read_text() == "# base: demo 1.3.0 -\n"
    assert load_engine(rworld.root, "demo").upstream.version == "1.3.0"
    assert not (rworld.series_dir / "DROPPED").exists()


def test_lint_against_another_release(rworld: World, cli: Cli) -> None:
    add_patches(rworld, ["util", "offset"])
    release = make_release(rworld)
    root = ["--root", str(rworld.root)]
    # the release is found once (the pin is a direct url), then remembered in build/cache/releases
    assert (
        cli(*root, "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri(), "--dry-run").code == 0
    )
    r = cli(*root, "lint", "demo", "--against", "1.3.0")
    assert r.code == 0, r.err
    assert "every hunk lands in the same symbol at 1.3.0" in r.out
    add_patches(rworld, ["run"])  # on top of the two: its context holds the def line upstream renamed
    r = cli(*root, "lint", "demo", "--against", "1.3.0")
    assert r.code == 3 and "against 1.3.0: patch 0003-engine-run-accumulates-explicitly.patch" in r.err
    assert "matches nowhere" in r.err and "--dry-run" in r.err


def test_json_output_is_the_report_file(rworld: World, cli: Cli) -> None:
    """`rebase --json` printed a document built without the state (no bases, no upstream status, no from artifacts)."""
    add_patches(rworld, ["util", "clean", "conflict"])
    release = make_release(rworld)
    r = cli(
        "--root", str(rworld.root), "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri(), "--json"
    )
    assert r.code == 3, r.err
    printed = json.loads(r.out)
    written = json.loads((rworld.root / "build" / "reports" / "demo-rebase.json").read_text())
    assert printed == written
    assert printed["bases"] is not None and all("upstream_status" in p for p in printed["patches"][:2])
    r = cli("--root", str(rworld.root), "rebase", "demo", "--json")  # the status of the stopped rebase
    assert r.code in (0, 3), r.err
    assert json.loads(r.out)["bases"] == written["bases"]
