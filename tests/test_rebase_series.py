"""The series file keeps its comments and blank lines through refresh and rebase (one writer,
overlay.core.series.render_series), and --skip of a patch that others require says which."""

from __future__ import annotations

from pathlib import Path

from overlay.core.series import render_series
from rebase_support import add_patches, make_rebase_world, make_release
from support import Cli

OLD = """\
# base: demo 1.2.0 -
# speculative decoding
0001-a.patch
0002-b.patch  # keep near a

# sampling, opt-in
0003-c.patch
0004-d.patch
# trailing note
"""


def test_render_series_keeps_comments_with_their_entries() -> None:
    same = render_series(
        OLD,
        header="# base: demo 1.2.0 -",
        names=["0001-a.patch", "0002-b.patch", "0003-c.patch", "0004-d.patch"],
    )
    assert same == OLD
    # b dropped, the rest renumbered; c's comment block and the trailing note stay, b's inline comment goes with b
    got = render_series(
        OLD, header="# base: demo 1.3.0 -", names=["0001-a.patch", "0002-c.patch", "0003-d.patch"]
    )
    assert got == (
        "# base: demo 1.3.0 -\n# speculative decoding\n0001-a.patch\n\n# sampling, opt-in\n0002-c.patch\n"
        "0003-d.patch\n# trailing note\n"
    )
    # reordered: a comment travels with its entry; a new entry has none
    got = render_series(
        OLD,
        header="# base: demo 1.2.0 -",
        names=["0001-c.patch", "0002-a.patch", "0003-new.patch"],
        previous={"0001-c.patch": "0003-c.patch"},
    )
    assert got == (
        "# base: demo 1.2.0 -\n\n# sampling, opt-in\n0001-c.patch\n# speculative decoding\n0002-a.patch\n"
        "0003-new.patch\n# trailing note\n"
    )


def _with_comments(series: Path, names: list[str]) -> str:
    head = series.read_text().splitlines()[0]
    text = (
        f"{head}\n# engine code\n{names[0]}\n\n# the next two go together\n{names[1]}  # upstreamed soon\n"
        f"{names[2]}\n\n# end of series\n"
    )
    series.write_text(text)
    return text


def test_rebase_keeps_series_comments_and_blank_lines(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    names = add_patches(world, ["util", "upstreamed", "clean"])
    _with_comments(world.series_dir / "series", names)
    release = make_release(world)
    r = cli("--root", str(world.root), "-q", "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 0, r.err
    got = (world.series_dir / "series").read_text()
    assert got == (
        "# base: demo 1.3.0 -\n# engine code\n0001-util-double-by-addition.patch\n\n"
        "# the next two go together\n0002-engine-clean_target-adds-the-other-way-round.patch\n\n"
        "# end of series\n"
    )


def test_refresh_rewrites_a_commented_series_byte_for_byte(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    names = add_patches(world, ["util", "clean", "offset"])
    text = _with_comments(world.series_dir / "series", names)
    root = ["--root", str(world.root)]
    assert cli(*root, "-q", "checkout", "demo").code == 0
    r = cli(*root, "-q", "refresh", "demo")
    assert r.code == 0, r.err
    assert (world.series_dir / "series").read_text() == text


def test_skipping_a_required_patch_names_the_patches_that_need_it(tmp_path: Path, cli: Cli) -> None:
    from rebase_support import PKG
    from support import TRAILERS

    world = make_rebase_world(tmp_path)
    add_patches(world, ["gone"])
    world.commit_change(
        PKG + "util.py",
        "return 2 * x",
        "return x + x",
        "util: double by addition",
        trailers=TRAILERS + "Overlay-Requires: 0001-old-old_api-adds-zero.patch\n",
    )
    world.export_series()
    root = ["--root", str(world.root)]
    release = make_release(world)
    assert (
        cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri()).code == 3
    )  # old.py is gone
    r = cli(*root, "rebase", "demo", "--skip")
    assert (
        "WARNING --skip dropped 0001-old-old_api-adds-zero.patch, which 0002-util-double-by-addition.patch "
        "requires (Overlay-Requires)"
    ) in r.err
    assert (
        r.code == 3 and "stopped for review" in r.err
    )  # and the broken requirement is looked at before publishing
