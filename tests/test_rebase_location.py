"""The hunk-location check pairs hunks by position (each hunk's lines mapped through the diff between the two trees),
never by how alike their changed lines are: the same added line in three functions is three hunks in three
functions, and only a hunk that really lands in another function is reported."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from overlay.core.series import Patch, parse_patch_bytes
from overlay.upstream.astmap import LineMap, check_hunk_locations
from support import Cli

BASE = b"""\
def first(x):
    a = x + 1
    return a


def second(x):
    b = x + 2
    return b


def third(x):
    c = x + 3
    return c
"""

SAME_LINE_PATCH = b"""\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: A <a@example.com>
Date: Thu, 1 Jan 2026 00:00:00 +0000
Subject: [PATCH] log every call

Body.
---
 m.py | 3 +++
 1 file changed, 3 insertions(+)

diff --git a/m.py b/m.py
--- a/m.py
+++ b/m.py
@@ -1,3 +1,4 @@
 def first(x):
+    trace()
     a = x + 1
     return a
@@ -6,3 +7,4 @@ def first(x):
 def second(x):
+    trace()
     b = x + 2
     return b
@@ -11,3 +13,4 @@ def second(x):
 def third(x):
+    trace()
     c = x + 3
     return c
-- SIGNATURE
2.43.0
""".replace(b"-- SIGNATURE", b"-- ")  # git's signature line ends in a space


def _patch(raw: bytes = SAME_LINE_PATCH) -> Patch:
    return parse_patch_bytes(raw, name="0001-log-every-call.patch")


def test_the_same_line_in_three_functions_on_identical_files_is_not_moved() -> None:
    assert check_hunk_locations({"m.py": BASE}, {"m.py": BASE}, [_patch()]) == []


def test_the_same_line_in_three_functions_after_upstream_inserted_code_is_not_moved() -> None:
    target = BASE.replace(b"def second(x):", b"def extra(x):\n    return x\n\n\ndef second(x):")
    assert check_hunk_locations({"m.py": BASE}, {"m.py": target}, [_patch()]) == []


LONG = "".join(
    f"def {name}(x):\n"
    + "".join(f"    v{i} = x + {i}  # {name}\n" if i != 4 else f"    v{i} = x * {i}\n" for i in range(8))
    + "    return x\n\n\n"
    for name in ("first", "second", "third")
).encode()


def _one_hunk_patch(before: bytes, after: bytes) -> Patch:
    import difflib

    diff = "".join(
        difflib.unified_diff(
            before.decode().splitlines(keepends=True),
            after.decode().splitlines(keepends=True),
            "a/m.py",
            "b/m.py",
            n=3,
        )
    )
    head = SAME_LINE_PATCH[: SAME_LINE_PATCH.index(b"diff --git")]
    return parse_patch_bytes(
        head + b"diff --git a/m.py b/m.py\n" + diff.encode() + b"-- \n2.43.0\n",
        name="0001-second-scales.patch",
    )


def _second_scales() -> Patch:
    # the same line, byte for byte, is in all three functions; the patch changes the one in second()
    i = LONG.index(b"def second")
    j = LONG.index(b"    v4 = x * 4\n", i)
    return _one_hunk_patch(LONG, LONG[:j] + b"    v4 = x * 40\n" + LONG[j + len(b"    v4 = x * 4\n") :])


def test_a_function_upstream_moved_whole_carries_its_hunk_along() -> None:
    # upstream moved second() below third(): the hunk is still in second
    i, k = LONG.index(b"def second"), LONG.index(b"def third")
    target = LONG[:i] + LONG[k:] + LONG[i:k]
    assert check_hunk_locations({"m.py": LONG}, {"m.py": target}, [_second_scales()]) == []


def test_code_upstream_moved_into_another_function_is_reported() -> None:
    # upstream renamed second() to helper() (the def line is outside the hunk's context): the hunk lands in helper
    target = LONG.replace(b"def second(x):", b"def helper(x):")
    moves = check_hunk_locations({"m.py": LONG}, {"m.py": target}, [_second_scales()])
    assert [(name, m.index, m.before, m.after) for name, m in moves] == [
        ("0001-second-scales.patch", 1, ("second",), ("helper",))
    ]


def test_line_map_follows_the_diff() -> None:
    old = b"a\nb\nc\nd\n"
    new = b"x\na\nb\ny\nd\n"
    m = LineMap(old, new)
    assert [m(i) for i in (1, 2, 3, 4)] == [2, 3, 4, 5]  # c changed: maps to where its change starts (y)
    assert LineMap(old, old)(3) == 3


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.network
def test_real_mlx_lm_series_lands_in_the_same_symbols_on_0_32_1(tmp_path: Path, cli: Cli) -> None:
    """On a fresh copy of the repository, the pinned 0.32.2 series checked against 0.32.1: 0016 (server.py hunk #10)
    and 0024 (gated_delta.py hunk #6) add lines that other hunks of the same patch add too; no move is reported."""
    root = tmp_path / "repo"
    (root / "build").mkdir(parents=True)
    shutil.copytree(REPO / "overlays", root / "overlays")
    shutil.copytree(REPO / "patches", root / "patches")
    shutil.copytree(
        REPO / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__", "tinymodels")
    )
    (REPO / "build" / "cache").mkdir(parents=True, exist_ok=True)
    (root / "build" / "cache").symlink_to(REPO / "build" / "cache")
    r = cli("--root", str(root), "lint", "mlx-lm", "--against", "0.32.1")
    assert r.code == 0, r.err
    assert "every hunk lands in the same symbol at 0.32.1" in r.out
