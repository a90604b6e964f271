"""Overlay-Flag, Overlay-Mechanism and Overlay-Requires: the vocabulary, the Patch accessors, lint's checks on real
series built with git in tmp_path, and the warnings refresh and rebase give when an order breaks a dependency."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from overlay.core.lint import check_declarations
from overlay.core.mechanism import (
    MECHANISM_THEMES,
    SCENARIOS,
    Flag,
    Mechanism,
    parse_flag,
    parse_mechanism,
    requires_problems,
)
from overlay.core.series import load_series, parse_patch
from overlay.errors import ConfigError
from rebase_support import PKG, add_patches, make_rebase_world, make_release
from support import GIT_ENV, TRAILERS, Cli, CliResult, World

REPO = Path(__file__).resolve().parents[1]
BASE_TRAILERS = TRAILERS.replace("Overlay-Flag: default\n", "")


def trailers(*, theme: str = "other", extra: str = "Overlay-Flag: default\n") -> str:
    return BASE_TRAILERS.replace("Overlay-Theme: other", f"Overlay-Theme: {theme}") + extra


def lint(cli: Cli, world: World) -> CliResult:
    return cli("--root", str(world.root), "lint", "demo")


# ------------------------------------------------------------------ vocabulary


def test_parse_mechanism_accepts_the_design_examples() -> None:
    assert parse_mechanism("host-syncs decreases in spec-verify-step", engine="sglang") == Mechanism(
        "host-syncs", "decreases", "spec-verify-step"
    )
    assert (
        parse_mechanism("capturable becomes-true in draft-extend").text
        == "capturable becomes-true in draft-extend"
    )
    assert (
        parse_mechanism("ops-per-token decreases in decode-token", engine="mlx-lm").scenario == "decode-token"
    )
    assert set(SCENARIOS) == {"sglang", "exllamav3", "mlx-lm", "vllm"}
    assert all(
        line for scen in SCENARIOS.values() for line in scen.values()
    )  # every scenario says what it is


@pytest.mark.parametrize(
    ("text", "engine", "expected"),
    [
        (
            "host-sync decreases in decode-step",
            None,
            "unknown metric 'host-sync' (did you mean 'host-syncs'?)",
        ),
        (
            "host-syncs decrease in decode-step",
            None,
            "unknown direction 'decrease' (did you mean 'decreases'?)",
        ),
        (
            "host-syncs decreases in decode-stpe",
            "sglang",
            "sglang has no scenario 'decode-stpe' (did you mean 'decode-step'?)",
        ),
        (
            "ops-per-token decreases in decode-step",
            "mlx-lm",
            "mlx-lm has no scenario 'decode-step' (did you mean 'decode-token'?)",
        ),
        ("host-syncs decreases in nowhere-at-all", None, "unknown scenario 'nowhere-at-all'"),
        (
            "capturable decreases in decode-step",
            None,
            "capturable is a property, it can only be becomes-true or unchanged",
        ),
        ("host-syncs becomes-true in decode-step", None, "becomes-true applies to capturable only"),
        ("host-syncs decreases decode-step", None, "is not `METRIC DIRECTION in SCENARIO`"),
        ("host-syncs decreases in decode-step", "demo", "engine 'demo' defines no census scenarios"),
    ],
)
def test_parse_mechanism_names_the_text_and_the_closest_word(
    text: str, engine: str | None, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mechanism(text, engine=engine)
    assert repr(text) in info.value.message
    assert expected in info.value.message


def test_parse_flag_kinds_and_refusals() -> None:
    assert parse_flag("SGLANG_OPT_CHAIN_TREE=1") == Flag("env", "SGLANG_OPT_CHAIN_TREE", "1")
    assert parse_flag("SGLANG_OPT_CHAIN_TREE=1").environ == {"SGLANG_OPT_CHAIN_TREE": "1"}
    assert parse_flag("--adaptive-draft") == Flag("cli", "--adaptive-draft", None)
    assert parse_flag("--draft_cache_quant=8").text == "--draft_cache_quant=8"
    assert parse_flag("default") == Flag("default", "default", None)
    assert parse_flag("default").environ == {}
    for bad, expected in [
        ("SGLANG_OPT_CHAIN_TREE", "an environment variable needs its value: `SGLANG_OPT_CHAIN_TREE=1`"),
        ("defualt", "did you mean 'default'?"),
        ("A=1 B=2", "must be one word"),
        ("-x", "is not a long CLI option"),
        ("1BAD=1", "is not an environment variable name"),
        ("X=", "X has no value"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_flag(bad)
        text = info.value.message + " " + (info.value.tip or "")
        assert repr(bad) in info.value.message and expected in text, text


def test_requires_problems_match_by_slug_and_order() -> None:
    order = [
        ("0001-a.patch", ()),
        ("0002-b.patch", ("0001-a.patch",)),
        ("0003-c.patch", ("0009-a.patch", "0004-d.patch")),
        ("0004-d.patch", ("0004-d.patch",)),
    ]
    got = requires_problems(order)
    # 0009-a.patch matches 0001-a.patch by its slug (refresh and rebase renumber); 0004-d is after 0003-c
    assert got == [
        (
            "0003-c.patch",
            "Overlay-Requires '0004-d.patch': that patch comes after it (position 4, this one is 3)",
        ),
        ("0004-d.patch", "Overlay-Requires '0004-d.patch' names the patch itself"),
    ]
    assert requires_problems([("0001-x.patch", ("0002-gone.patch",))]) == [
        ("0001-x.patch", "Overlay-Requires '0002-gone.patch': no such patch in the series")
    ]


# ------------------------------------------------------------------ Patch accessors and lint on real series


def test_patch_accessors_read_repeated_trailers(world: World) -> None:
    world.commit_change(
        "python/demo_pkg/core.py", 'prefix = "hello"', 'prefix = "hi"', "core: shorter greeting"
    )
    extra = (
        "Overlay-Flag: DEMO_OPT_X=1\nOverlay-Flag: --fast\nOverlay-Mechanism: host-syncs decreases in decode-step\n"
        "Overlay-Mechanism: capturable becomes-true in draft-extend\nOverlay-Requires: 0001-core-shorter-greeting.patch\n"
    )
    world.commit_change(
        "python/demo_pkg/util.py",
        "return 2 * x",
        "return x + x",
        "util: double",
        trailers=trailers(extra=extra),
    )
    names = world.export_series()
    first, second = (parse_patch(world.series_dir / n) for n in names)
    assert second.trailer_values("Overlay-Mechanism") == (
        "host-syncs decreases in decode-step",
        "capturable becomes-true in draft-extend",
    )
    assert second.flags == (Flag("env", "DEMO_OPT_X", "1"), Flag("cli", "--fast", None))
    assert [m.metric for m in second.mechanisms] == ["host-syncs", "capturable"]
    assert second.requires == ("0001-core-shorter-greeting.patch",)
    assert (
        first.flags == (Flag("default", "default", None),) and first.mechanisms == () and first.requires == ()
    )
    assert second.upstream_status == "Pending"  # the four trailers are still read before the new ones


def test_lint_requires_an_overlay_flag(world: World, cli: Cli) -> None:
    world.commit_change(
        "python/demo_pkg/core.py",
        'prefix = "hello"',
        'prefix = "hi"',
        "core: shorter greeting",
        trailers=trailers(extra=""),
    )
    world.export_series()
    r = lint(cli, world)
    assert r.code == 2
    assert "0001-core-shorter-greeting.patch: missing trailer Overlay-Flag:" in r.err
    assert "TIP fix the trailer in the commit message" in r.err


def test_lint_checks_the_flag_is_in_the_added_lines(world: World, cli: Cli) -> None:
    world.commit_change(
        "python/demo_pkg/core.py",
        'prefix = "hello"',
        'prefix = "hi"',
        "core: shorter greeting",
        trailers=trailers(extra="Overlay-Flag: DEMO_OPT_FAST=1\n"),
    )
    world.export_series()
    r = lint(cli, world)
    assert r.code == 2
    assert "Overlay-Flag 'DEMO_OPT_FAST=1': DEMO_OPT_FAST is not in any line its diff adds" in r.err


def test_lint_accepts_a_flag_the_diff_adds_and_a_required_patch_flag(world: World, cli: Cli) -> None:
    world.commit_change(
        "python/demo_pkg/core.py",
        'prefix = "hello"',
        'prefix = "hi" if __import__("os").environ.get("DEMO_OPT_FAST") == "1" else "hello"',
        "core: opt-in shorter greeting",
        trailers=trailers(extra="Overlay-Flag: DEMO_OPT_FAST=1\n"),
    )
    # the second patch rides on the first one's flag: allowed because it requires that patch
    world.commit_change(
        "python/demo_pkg/util.py",
        "return 2 * x",
        "return x + x",
        "util: double",
        trailers=trailers(
            extra="Overlay-Flag: DEMO_OPT_FAST=1\nOverlay-Requires: 0001-core-opt-in-shorter-greeting.patch\n"
        ),
    )
    world.export_series()
    r = lint(cli, world)
    assert r.code == 0, r.err
    assert "demo: ok (2 patches apply exactly)" in r.out


def test_lint_refuses_a_bad_flag_syntax(world: World, cli: Cli) -> None:
    world.commit_change(
        "python/demo_pkg/core.py",
        'prefix = "hello"',
        'prefix = "hi"',
        "core: shorter greeting",
        trailers=trailers(extra="Overlay-Flag: default\nOverlay-Flag: DEMO_OPT\n"),
    )
    world.export_series()
    r = lint(cli, world)
    assert r.code == 2
    assert "Overlay-Flag 'DEMO_OPT' is neither ENV=VALUE" in r.err
    assert "Overlay-Flag `default` (always on) cannot be combined" not in r.err  # the bad one did not parse
    assert "missing trailer Overlay-Flag" not in r.err


@pytest.mark.parametrize("theme", MECHANISM_THEMES)
def test_lint_requires_a_mechanism_for_the_mechanism_themes(world: World, cli: Cli, theme: str) -> None:
    world.commit_change(
        "python/demo_pkg/core.py",
        'prefix = "hello"',
        'prefix = "hi"',
        "core: shorter greeting",
        trailers=trailers(theme=theme),
    )
    world.export_series()
    r = lint(cli, world)
    assert r.code == 2
    assert f"Overlay-Theme {theme} needs at least one Overlay-Mechanism" in r.err


def test_lint_checks_mechanism_names_against_the_engine(world: World, cli: Cli) -> None:
    world.commit_change(
        "python/demo_pkg/core.py",
        'prefix = "hello"',
        'prefix = "hi"',
        "core: shorter greeting",
        trailers=trailers(
            theme="cuda-graph",
            extra="Overlay-Flag: default\nOverlay-Mechanism: eager-launches decreases in decode-step\n",
        ),
    )
    names = world.export_series()
    r = lint(cli, world)
    assert r.code == 2
    assert "engine 'demo' defines no census scenarios" in r.err  # the demo engine has no census
    assert "needs at least one Overlay-Mechanism" not in r.err  # one is declared, it just names nothing real
    patch = parse_patch(world.series_dir / names[0])
    assert check_declarations(patch, engine="sglang") == []
    got = check_declarations(patch, engine="mlx-lm")
    assert got == [
        (
            "Overlay-Mechanism 'eager-launches decreases in decode-step': mlx-lm has no scenario 'decode-step' "
            "(did you mean 'decode-token'?)"
        )
    ]


def test_lint_requires_an_earlier_patch_of_the_series(world: World, cli: Cli) -> None:
    world.commit_change(
        "python/demo_pkg/core.py",
        'prefix = "hello"',
        'prefix = "hi"',
        "core: shorter greeting",
        trailers=trailers(extra="Overlay-Flag: default\nOverlay-Requires: 0002-util-double.patch\n"),
    )
    world.commit_change(
        "python/demo_pkg/util.py",
        "return 2 * x",
        "return x + x",
        "util: double",
        trailers=trailers(
            extra="Overlay-Flag: default\nOverlay-Requires: 0007-not-here.patch\n"
            "Overlay-Requires: util-double\n"
        ),
    )
    world.export_series()
    r = lint(cli, world)
    assert r.code == 2
    assert (
        "0001-core-shorter-greeting.patch: Overlay-Requires '0002-util-double.patch': that patch comes after it "
        "(position 2, this one is 1)"
    ) in r.err
    assert (
        "0002-util-double.patch: Overlay-Requires '0007-not-here.patch': no such patch in the series" in r.err
    )
    assert "Overlay-Requires 'util-double' is not a patch file name (NNNN-slug.patch)" in r.err


# ------------------------------------------------------------------ reorder and skip warn


def test_refresh_warns_when_a_reorder_puts_a_required_patch_after(world: World, cli: Cli) -> None:
    world.commit_change(
        "python/demo_pkg/core.py", 'prefix = "hello"', 'prefix = "hi"', "core: shorter greeting"
    )
    world.commit_change(
        "python/demo_pkg/util.py",
        "return 2 * x",
        "return x + x",
        "util: double",
        trailers=trailers(
            extra="Overlay-Flag: default\nOverlay-Requires: 0001-core-shorter-greeting.patch\n"
        ),
    )
    world.export_series()
    root = ["--root", str(world.root)]
    assert lint(cli, world).code == 0
    wt = Path(cli(*root, "-q", "checkout", "demo").out.strip())
    r = cli(*root, "refresh", "demo")
    assert r.code == 0 and "WARNING" not in r.err  # in order: nothing to say
    env = {**os.environ, **GIT_ENV, "GIT_SEQUENCE_EDITOR": "sed -i '1{h;d};2{G}'"}
    subprocess.run(["git", "rebase", "-q", "-i", "overlay/base"], cwd=wt, env=env, check=True)
    r = cli(*root, "refresh", "demo", "--json")
    assert r.code == 0, r.err  # a warning, not an error
    assert json.loads(r.out)["warnings"] == [
        (
            "0001-util-double.patch: Overlay-Requires '0001-core-shorter-greeting.patch': that patch comes after it "
            "(position 2, this one is 1); move the patch after the one it needs, or restore that one "
            "(or remove the Overlay-Requires line if it no longer applies)"
        )
    ]
    assert "WARNING 0001-util-double.patch: Overlay-Requires '0001-core-shorter-greeting.patch'" in r.err
    assert load_series(world.series_dir).names == (
        "0001-util-double.patch",
        "0002-core-shorter-greeting.patch",
    )
    assert lint(cli, world).code == 2  # lint refuses what refresh only warned about


def test_rebase_skip_warns_for_a_patch_that_requires_the_skipped_one(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["gone"])
    world.commit_change(
        PKG + "util.py",
        "return 2 * x",
        "return x + x",
        "util: double by addition",
        trailers=trailers(
            extra="Overlay-Flag: default\nOverlay-Requires: 0001-old-old_api-adds-zero.patch\n"
        ),
    )
    world.export_series()
    release = make_release(world)
    root = ["--root", str(world.root)]
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3 and "WARNING" not in r.err  # stopped on the obsolete patch; nothing dropped yet
    r = cli(*root, "rebase", "demo", "--skip")
    assert r.code == 3 and "stopped for review" in r.err, (
        r.err
    )  # a broken Overlay-Requires: not published blindly
    assert (
        "WARNING 0002-util-double-by-addition.patch: Overlay-Requires '0001-old-old_api-adds-zero.patch': "
        "no such patch in the series"
    ) in r.err
    report = json.loads((world.root / "build" / "reports" / "demo-rebase.json").read_text())
    assert len(report["warnings"]) == 1 and "0001-old-old_api-adds-zero.patch" in report["warnings"][0]
    r = cli(*root, "rebase", "demo", "--publish")
    assert r.code == 0, r.err
    assert load_series(world.series_dir).names == ("0001-util-double-by-addition.patch",)


# ------------------------------------------------------------------ the shipped series


@pytest.mark.parametrize("engine", ["sglang", "exllamav3", "mlx-lm", "vllm"])
def test_every_shipped_patch_declares_its_flag_and_mechanisms(engine: str) -> None:
    series = load_series(REPO / "patches" / engine)
    table = (REPO / "docs" / "engines" / "mechanisms.md").read_text()
    for patch in series.patches:
        assert check_declarations(patch, engine=engine, series=series.patches) == [], patch.name
        assert patch.flags, patch.name
        assert f"`{patch.name}`" in table, f"{patch.name} is missing from docs/engines/mechanisms.md"
        for m in patch.mechanisms:
            assert m.text in table, (patch.name, m.text)
