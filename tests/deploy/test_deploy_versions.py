"""Ordered version labels: a later series sorts above an earlier one of the same release; ``==UPSTREAM`` holds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from overlay.core.provenance import check_label
from overlay.core.series import Patch
from overlay.core.versions import (
    built_wheels,
    history_order,
    order_number,
    ordered_local_version,
    series_order,
    stale_wheels,
)
from overlay.errors import ConfigError, IntegrityError
from support import GIT_ENV


def patch(name: str, date: str, raw: bytes = b"x") -> Patch:
    return Patch(
        name=name, raw=raw + name.encode(), author="a", date=date, subject="s", body="", trailers=(), files=()
    )


def test_order_is_the_latest_patch_date_in_utc() -> None:
    ps = [
        patch("0001-a.patch", "Mon, 30 Nov 2026 10:06:20 +0000"),
        patch("0002-b.patch", "Tue, 1 Dec 2026 01:00:00 +0200"),
    ]
    assert order_number(ps) == 20261130230000  # 01:00 +0200 is 23:00 UTC the day before: not the latest
    assert order_number([]) == 0
    with pytest.raises(ConfigError, match="not an RFC 2822 date"):
        order_number([patch("0001-a.patch", "yesterday")])


def test_a_later_series_sorts_above_whatever_its_count_or_hash() -> None:
    old = [patch(f"000{i}-p.patch", "Mon, 30 Nov 2026 10:00:00 +0000", raw=b"old") for i in range(1, 4)]
    new = [patch("0001-p.patch", "Tue, 1 Dec 2026 09:00:00 +0000", raw=b"new")]  # fewer patches, later
    v_old = Version(ordered_local_version("0.5.23", "ovl", old))
    v_new = Version(ordered_local_version("0.5.23", "ovl", new))
    assert v_new > v_old
    # same count, same dates: without an order the hash string decides; with history the later commit wins
    a = Version(ordered_local_version("0.5.23", "ovl", old, order=20261130100000))
    b = Version(ordered_local_version("0.5.23", "ovl", old, order=20261201100000))
    assert b > a
    for v in (v_old, v_new, a, b):
        assert v in SpecifierSet("==0.5.23", prereleases=False) and v.public == "0.5.23"
        assert v not in SpecifierSet("==0.5.22")


def test_the_series_git_history_dates_an_edit_that_kept_every_date(tmp_path: Path) -> None:
    series_dir = tmp_path / "patches" / "demo"
    series_dir.mkdir(parents=True)
    ps = [patch("0001-a.patch", "Mon, 30 Nov 2026 10:06:20 +0000")]
    (series_dir / "series").write_text("0001-a.patch\n")
    (series_dir / "0001-a.patch").write_bytes(b"one")
    assert history_order(tmp_path, series_dir, ps) == 0  # not a git work tree: dates alone
    env = {**GIT_ENV, "GIT_COMMITTER_DATE": "2026-12-05T06:07:08Z"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "series"]):
        subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True)
    assert history_order(tmp_path, series_dir, ps) == 20261205060708
    assert series_order(ps, root=tmp_path, series_dir=series_dir) == 20261205060708
    assert series_order(ps) == 20261130100620


def test_check_label_reads_old_and_new_labels_and_refuses_a_forged_order() -> None:
    sha = "ab" * 32
    data = {
        "upstream": {"version": "1.2.0"},
        "series": {"sha256": sha, "order": 20261201000000, "patches": [{}]},
    }
    check_label(data, f"1.2.0+ovl.20261201000000.1.g{sha[:8]}", "w")
    check_label(
        {**data, "series": {"sha256": sha, "patches": [{}]}}, f"1.2.0+ovl.1.g{sha[:8]}", "w"
    )  # older builds
    with pytest.raises(
        IntegrityError, match="says order 20261202000000, overlay.json says series.order 20261201000000"
    ):
        check_label(data, f"1.2.0+ovl.20261202000000.1.g{sha[:8]}", "w")


def test_built_and_stale_wheels(tmp_path: Path) -> None:
    for name in (
        "demo_engine-1.2.0+ovl.2.1.gaaaaaaaa-py3-none-any.whl",
        "demo_engine-1.2.0+ovl.1.1.gbbbbbbbb-py3-none-any.whl",
        "other-1.0-py3-none-any.whl",
        "not-a-wheel.whl",
    ):
        (tmp_path / name).write_bytes(b"")
    found = built_wheels(tmp_path, "demo-engine")
    assert [str(w.version) for w in found] == ["1.2.0+ovl.1.1.gbbbbbbbb", "1.2.0+ovl.2.1.gaaaaaaaa"]
    stale = stale_wheels(tmp_path, "demo-engine", [found[1].path])
    assert [w.path for w in stale] == [found[0].path]
