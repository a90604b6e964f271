"""overlay review on synthetic upstreams: symbols our hunks sit in, what upstream did to them, duplicates, range-diff,
where the older series comes from, and the HTML report rendered in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from overlay.cli.main import main
from rebase_support import PKG, add_patches, make_rebase_world, make_release
from support import GIT_ENV, Cli, World

REPO = Path(__file__).resolve().parents[1]
ENGINE = PKG + "engine.py"


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory) -> tuple[World, dict[str, Any], Path]:
    """A series at 1.2.0 reviewed against 1.3.0 before any rebase (the rebase is replayed on the fly)."""
    world = make_rebase_world(tmp_path_factory.mktemp("review"))
    add_patches(world, ["clean", "offset", "upstreamed", "equivalent", "plan", "run", "renamed"])
    release = make_release(world)
    html = world.root / "build" / "reports" / "demo-review.html"
    code = main(
        [
            "--root",
            str(world.root),
            "-q",
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
        ]
    )
    assert code == 0
    data = json.loads((world.root / "build" / "reports" / "demo-review.json").read_text())
    return world, data, html


def test_review_names_the_symbols_upstream_changed(reviewed: tuple[World, dict[str, Any], Path]) -> None:
    _world, data, _html = reviewed
    assert (
        data["version"] == 1 and data["from"] == "1.2.0" and data["to"] == "1.3.0" and data["anchor"] == "old"
    )
    status = {(s["path"], s["symbol"]): s["status"] for s in data["symbols"]}
    assert status == {
        (ENGINE, "clean_target"): "unchanged",
        (ENGINE, "offset_target"): "unchanged",
        (ENGINE, "upstreamed_target"): "changed",
        (ENGINE, "equivalent_target"): "rewritten",
        (ENGINE, "Scheduler.plan"): "rewritten",
        (ENGINE, "Scheduler.run"): "renamed",
        (PKG + "legacy.py", "legacy_sum"): "unchanged",
    }
    run = next(s for s in data["symbols"] if s["symbol"] == "Scheduler.run")
    assert run["new_symbol"] == "Scheduler.execute" and run["flagged"]
    assert run["patches"] == ["0006-engine-run-accumulates-explicitly.patch"]
    assert any("Scheduler.plan: rewritten upstream" in f for f in data["flags"])
    files = {f["path"]: (f["status"], f["new_path"]) for f in data["files"]}
    assert files[PKG + "legacy.py"] == ("renamed", PKG + "compat.py")
    # duplicates: the patch upstream made verbatim, and the one upstream made in its own words
    dups = {d["patch"]: d["evidence"] for d in data["duplicates"]}
    assert dups == {
        "0003-engine-upstreamed_target-commutes.patch": "reverse-applies",
        "0004-engine-equivalent_target-avoids-the-mutable-default.patch": "added-lines",
    }
    # the replayed rebase's classes are part of the review
    classes = {p["name"][:4]: p["rebase_class"] for p in data["patches"]}
    assert classes == {
        "0001": "clean",
        "0002": "offset",
        "0003": "upstreamed",
        "0004": "upstreamed",
        "0005": "conflict",
        "0006": "merged",
        "0007": "obsolete",
    }


def test_review_range_diff_and_hunk_location_check(reviewed: tuple[World, dict[str, Any], Path]) -> None:
    _world, data, _html = reviewed
    rd = {(e["old"] or "-")[:4]: (e["marker"], e["kind"], (e["new"] or "-")[:4]) for e in data["range_diff"]}
    assert rd == {
        "0001": ("=", "identical", "0001"),
        "0002": ("=", "identical", "0002"),  # an offset moves lines only
        "0003": ("<", "dropped", "-"),
        "0004": ("<", "dropped", "-"),
        "0005": ("<", "dropped", "-"),  # a conflict is left out of a replay
        "0006": ("!", "context-only", "0006"),
        "0007": ("<", "dropped", "-"),
    }
    run = next(e for e in data["range_diff"] if e["old"].startswith("0006"))
    assert run["moved_hunks"] == [
        {"path": ENGINE, "hunk": 1, "before": ["Scheduler.run"], "after": ["Scheduler.execute"]}
    ]
    conflict = next(e for e in data["range_diff"] if e["old"].startswith("0005"))
    assert conflict["note"].startswith("conflict: 3-way merge conflicts in")


def test_review_after_rebase_pairs_renumbered_patches(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["util", "upstreamed", "clean"])
    release = make_release(world)
    root = ["--root", str(world.root)]
    assert cli(*root, "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri()).code == 0
    r = cli(*root, "review", "demo", "--from", "1.2.0", "--to", "1.3.0", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["series"]["from"] == "build/rebase-history/demo/1.2.0-to-1.3.0/old"
    pairs = [(e["old"], e["marker"], e["new"]) for e in data["range_diff"]]
    assert pairs == [
        ("0001-util-double-by-addition.patch", "=", "0001-util-double-by-addition.patch"),
        ("0002-engine-upstreamed_target-commutes.patch", "<", None),
        (
            "0003-engine-clean_target-adds-the-other-way-round.patch",
            "=",
            "0002-engine-clean_target-adds-the-other-way-round.patch",
        ),
    ]
    assert data["range_diff"][1]["note"].startswith("upstreamed: reverse-applies on 1.3.0")


def test_review_finds_the_old_series_in_git_history(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["util", "plan"])
    release = make_release(world)
    env = {**os.environ, **GIT_ENV}

    def g(*args: str) -> None:
        subprocess.run(["git", *args], cwd=world.root, env=env, check=True, capture_output=True)

    (world.root / ".gitignore").write_text("/build/\n")
    g("init", "-q")
    g("add", "-A")
    g("commit", "-qm", "series at 1.2.0")
    root = ["--root", str(world.root)]
    assert cli(*root, "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri()).code == 3
    assert cli(*root, "-q", "rebase", "demo", "--skip").code == 0
    g("add", "-A")
    g("commit", "-qm", "rebase onto 1.3.0")
    shutil.rmtree(world.root / "build" / "rebase-history")
    r = cli(*root, "review", "demo", "--from", "1.2.0", "--to", "1.3.0", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["series"]["from"].startswith("git ") and data["series"]["from"].endswith(":patches/demo")
    assert [(e["old"], e["kind"]) for e in data["range_diff"]] == [
        ("0001-util-double-by-addition.patch", "identical"),
        ("0002-engine-note-in-plan.patch", "dropped"),
    ]
    assert any(s["symbol"] == "Scheduler.plan" and s["status"] == "rewritten" for s in data["symbols"])


def test_review_without_the_older_series_says_so(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["util", "run"])
    release = make_release(world)
    root = ["--root", str(world.root)]
    assert (
        cli(*root, "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri()).code == 3
    )  # for review
    assert cli(*root, "-q", "rebase", "demo", "--publish").code == 0
    shutil.rmtree(world.root / "build" / "rebase-history")
    r = cli(*root, "review", "demo", "--from", "1.2.0", "--to", "1.3.0", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert (
        data["anchor"] == "new"
        and data["range_diff"] is None
        and "no copy of the series at 1.2.0" in data["notes"][0]
    )
    # located in the series at 1.3.0 (Scheduler.execute), reported the way upstream went: 1.2.0's run renamed
    run = next(s for s in data["symbols"] if s["new_symbol"] == "Scheduler.execute")
    assert (run["symbol"], run["status"], run["flagged"]) == ("Scheduler.run", "renamed", True)
    assert "run: renamed upstream to " in run["summary"]
    r = cli(*root, "review", "demo", "--from", "1.1.0", "--to", "1.2.0")
    assert r.code == 2 and "neither --from 1.1.0 nor --to 1.2.0" in r.err


@pytest.mark.browser
def test_html_report_renders_in_headless_chromium(
    reviewed: tuple[World, dict[str, Any], Path], tmp_path: Path
) -> None:
    _world, data, html = reviewed
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium package is not installed (scripts/test.sh installs it)")
    text = html.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text  # self-contained
    shots = REPO / "build" / "reports"
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / "test-review-demo.png"
    shot.unlink(missing_ok=True)
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", html.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    for p in data["patches"]:
        assert p["name"] in page
    for sym in ("Scheduler.plan", "Scheduler.execute", "equivalent_target", "clean_target"):
        assert sym in page
    assert "rewritten" in page and "renamed" in page and 'class="sbs"' in page
    snap = subprocess.run(
        [chromium, *flags, f"--screenshot={shot}", "--window-size=1400,2000", html.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert snap.returncode == 0, snap.stderr[-2000:]
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_review_spots_an_upstream_change_with_our_patch_s_ast(tmp_path: Path, cli: Cli) -> None:
    """Upstream made our change in other words (other formatting, a comment): reverse-apply and the 3-way merge
    cannot see it, the AST comparison can."""
    from rebase_support import release_files

    world = make_rebase_world(tmp_path)
    world.commit_change(ENGINE, "a = x + 1", "a = 1 + x  # commuted", "engine: clean_target commutes")
    world.export_series()
    files = release_files(
        world, edits=[("engine.py", "a = x + 1", "a = (1 + x)")], rename_legacy=False, delete_old=False
    )
    release = make_release(world, files=files)
    r = cli(
        "--root",
        str(world.root),
        "review",
        "demo",
        "--from",
        "1.2.0",
        "--to",
        "1.3.0",
        "--to-url",
        release.as_uri(),
        "--json",
    )
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["patches"][0]["rebase_class"] == "conflict"
    assert [(d["evidence"], d["detail"]) for d in data["duplicates"]] == [
        (
            "ast-equivalent",
            f"1.3.0's {ENGINE}::clean_target has the same AST as our patched {ENGINE}::clean_target",
        )
    ]
