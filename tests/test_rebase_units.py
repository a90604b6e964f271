"""Units under rebase and review: hunk relocation and reversal, in-place manifest edits, ast symbol mapping, git tree
ids, and refresh's check that the worktree's base is the pinned tree."""

from __future__ import annotations

import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest

from overlay.core.patching import MemoryTree, apply_patch
from overlay.core.pin_edit import Edit, apply_edits, replace_tables
from overlay.core.series import parse_patch_bytes
from overlay.errors import ConfigError, PatchError
from overlay.git.objects import tree_id
from overlay.upstream.astmap import SymbolIndex, compare_symbol, hunk_locations, hunk_moves, symbols
from overlay.upstream.relocate import relocate_patch, reverse_patch
from support import GIT_ENV, Cli, World, make_wheel

BASE = "".join(f"line {i}\n" for i in range(1, 21))


def make_patch(old: str, new: str, path: str = "f.py", name: str = "0001-x.patch") -> bytes:
    """A real `git diff` of old -> new, wrapped as a format-patch file."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp, "a"), Path(tmp, "b")
        a.write_text(old)
        b.write_text(new)
        out = subprocess.run(
            ["git", "diff", "--no-index", "--full-index", str(a), str(b)],
            capture_output=True,
            env={**os.environ, **GIT_ENV},
            check=False,
        ).stdout.decode()
    body = out.split("\n", 1)[1].replace(f"a{a}", f"a/{path}").replace(f"b{b}", f"b/{path}")
    header = f"diff --git a/{path} b/{path}\n"
    return (
        f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: T <t@e>\nDate: Fri, 2 Jan 2026"
        f" 03:04:05 +0000\nSubject: [PATCH] x\n\nbody\n---\n f | 1 +\n\n{header}{body}"
    ).encode()


def test_relocate_finds_exact_context_elsewhere_and_never_fuzzes() -> None:
    patch = parse_patch_bytes(make_patch(BASE, BASE.replace("line 10\n", "line ten\n")), name="0001-x.patch")
    shifted = "new a\nnew b\nnew c\n" + BASE
    tree = MemoryTree({"f.py": shifted.encode()})
    with pytest.raises(PatchError):
        apply_patch(MemoryTree(dict(tree.files)), patch)
    moved, placements = relocate_patch(tree, patch)
    assert [p.offset for p in placements] == [3]
    apply_patch(tree, moved)
    assert tree.files["f.py"].decode() == shifted.replace("line 10\n", "line ten\n")
    # one context line differs: no fuzz, the hunk matches nowhere
    fuzzy = MemoryTree({"f.py": BASE.replace("line 8\n", "line eight\n").encode()})
    with pytest.raises(PatchError, match="matches nowhere"):
        relocate_patch(fuzzy, patch)


def test_reverse_patch_detects_a_change_already_made() -> None:
    patch = parse_patch_bytes(make_patch(BASE, BASE.replace("line 10\n", "line ten\n")), name="0001-x.patch")
    upstream = ("header\n" + BASE.replace("line 10\n", "line ten\n")).encode()
    rev, placements = relocate_patch(MemoryTree({"f.py": upstream}), reverse_patch(patch))
    tree = MemoryTree({"f.py": upstream})
    apply_patch(tree, rev)
    assert tree.files["f.py"].decode() == "header\n" + BASE and placements[0].offset == 1


MANIFEST = """\
# pinned at 1.0 (comment kept)
[engine]
name = "demo"

[upstream]
version = "1.0"   # trailing comment kept
tag = "v1.0"
commit = "0123456789012345678901234567890123456789"
package-root = ""

[[upstream.artifacts]]
filename = "a-1.0.whl"
sha256 = "aa"

[[upstream.artifacts]]
filename = "a-1.0.tar.gz"
sha256 = "bb"
"""


def test_toml_edits_keep_comments_and_layout() -> None:
    out = apply_edits(
        MANIFEST,
        [
            Edit("upstream", "version", "1.1"),
            Edit("upstream", "commit", None, comment="commit: unknown for 1.1"),
            Edit("upstream.artifacts", "sha256", "cc", index=1),
            Edit("upstream.artifacts", "url", "file:///x/a-1.1.whl", index=0),
        ],
        where="m.toml",
    )
    assert out == MANIFEST.replace('version = "1.0"   #', 'version = "1.1"   #').replace(
        'commit = "0123456789012345678901234567890123456789"\n', ""
    ).replace("[upstream]\n", "[upstream] # commit: unknown for 1.1\n").replace(
        'sha256 = "bb"', 'sha256 = "cc"'
    ).replace('sha256 = "aa"\n', 'sha256 = "aa"\nurl = "file:///x/a-1.1.whl"\n')


def test_toml_edits_follow_the_structure_not_the_lines() -> None:
    """A multi-line string that holds a table header and a key is data: the regex editor used to edit inside it."""
    tricky = MANIFEST.replace(
        'name = "demo"\n',
        'name = "demo"\nnotes = """\n[upstream.artifacts]\nsha256 = "aa"\nversion = "1.0"\n"""\n',
    )
    out = apply_edits(
        tricky,
        [Edit("upstream", "version", "2"), Edit("upstream.artifacts", "sha256", "dd", index=0)],
        where="m.toml",
    )
    assert '"""\n[upstream.artifacts]\nsha256 = "aa"\nversion = "1.0"\n"""' in out
    doc = tomllib.loads(out)
    assert doc["upstream"]["version"] == "2" and doc["upstream"]["artifacts"][0]["sha256"] == "dd"
    assert (
        apply_edits('[upstream]\nversion = """1.0"""\n', [Edit("upstream", "version", "2")], where="m")
        == '[upstream]\nversion = "2"\n'
    )
    with pytest.raises(ConfigError, match=r"\[\[upstream.artifacts\]\] has 2 entries; entry 5"):
        apply_edits(MANIFEST, [Edit("upstream.artifacts", "sha256", "x", index=5)], where="m.toml")
    with pytest.raises(ConfigError, match="m.toml: not valid TOML"):
        apply_edits("[upstream\n", [Edit("upstream", "version", "2")], where="m.toml")


def test_artifact_tables_are_replaced_when_the_release_has_other_files() -> None:
    out = replace_tables(
        MANIFEST,
        "upstream.artifacts",
        [{"filename": f"a-1.1-{i}.whl", "sha256": f"{i}" * 4} for i in range(3)],
        where="m.toml",
        comment="3 files of 1.1",
    )
    doc = tomllib.loads(out)
    assert [a["filename"] for a in doc["upstream"]["artifacts"]] == [
        "a-1.1-0.whl",
        "a-1.1-1.whl",
        "a-1.1-2.whl",
    ]
    assert out.startswith(
        MANIFEST.split("[[upstream.artifacts]]")[0]
    )  # everything above the tables as it was
    assert "[[upstream.artifacts]] # 3 files of 1.1\n" in out


MODULE = textwrap.dedent(
    """\
    import os


    def top(x):
        y = x + 1
        return y


    class Box:
        @property
        def size(self):
            return 1

        @size.setter
        def size(self, v):
            pass

        def fill(self, n):
            items = []
            for i in range(n):
                items.append(i)
            return items
    """
)


def test_symbols_and_hunk_locations() -> None:
    syms = {s.qualname: (s.start, s.end) for s in symbols(MODULE) or []}
    assert syms == {
        "top": (4, 6),
        "Box": (9, 22),
        "Box.size": (10, 12),
        "Box.size[2]": (14, 16),
        "Box.fill": (18, 22),
    }
    new = MODULE.replace("            items.append(i)\n", "            items.append(i * 2)\n")
    new = new.replace("import os\n", "import os\nimport sys\n")
    new = new.replace(
        "    def fill(self, n):\n", "    def helper(self):\n        return 0\n\n    def fill(self, n):\n"
    )
    assert new.count("helper") == 1
    patch = parse_patch_bytes(make_patch(MODULE, new, path="m.py"), name="0001-x.patch")
    locs = hunk_locations(patch, lambda p: MODULE.encode())
    # an import at module level; a new method inserted in the class body, and a change inside Box.fill
    assert [loc.symbols for loc in locs] == [("<module>",), ("Box", "Box.fill")]
    assert symbols("def broken(:\n") is None


def test_hunk_moves_reports_a_hunk_that_landed_in_another_function() -> None:
    old = "def a():\n    x = 1\n    return x\n\n\ndef b():\n    x = 1\n    return x\n"
    p_old = parse_patch_bytes(
        make_patch(
            old, old.replace("    x = 1\n    return x\n\n\ndef b", "    x = 2\n    return x\n\n\ndef b")
        ),
        name="0001-x.patch",
    )
    # the same change landing in b() instead (what a fuzzy or offset apply can do)
    p_new = parse_patch_bytes(
        make_patch(old, old[: old.index("def b")] + "def b():\n    x = 2\n    return x\n"),
        name="0001-x.patch",
    )
    moves = hunk_moves(p_old, lambda p: old.encode(), p_new, lambda p: old.encode())
    assert len(moves) == 1 and moves[0].before == ("a",) and moves[0].after == ("b",)
    assert hunk_moves(p_old, lambda p: old.encode(), p_old, lambda p: old.encode()) == []


def test_compare_symbol_statuses() -> None:
    a = {
        "m.py": b"def keep():\n    return 1\n\n\ndef edit():\n    a = 1\n    b = 2\n    c = 3\n    return a + b + c\n\n\n"
        b"def gone():\n    return 0\n\n\ndef old_name(x):\n    total = x * 2\n    total += 7\n    return total\n\n\n"
        b"def travel():\n    return 'far away'\n",
        "n.py": b"",
    }
    b = {
        "m.py": b"def keep():\n    return 1\n\n\ndef edit():\n    a = 1\n    b = 2\n    c = 4\n    return a + b + c\n\n\n"
        b"def new_name(x):\n    total = x * 2\n    total += 7\n    return total\n",
        "n.py": b"def travel():\n    return 'far away'\n",
    }
    ia, ib = SymbolIndex(a), SymbolIndex(b)
    got = {q: compare_symbol("m.py", q, ia, ib) for q in ("keep", "edit", "gone", "old_name", "travel")}
    assert {q: c.status for q, c in got.items()} == {
        "keep": "unchanged",
        "edit": "changed",
        "gone": "deleted",
        "old_name": "renamed",
        "travel": "moved",
    }
    assert got["old_name"].new_qualname == "new_name" and got["travel"].new_path == "n.py"
    assert got["edit"].added == 1 and got["edit"].removed == 1 and not got["edit"].flagged
    assert got["gone"].flagged and got["travel"].flagged


def test_tree_id_matches_git(tmp_path: Path) -> None:
    files = {"a.txt": b"A\n", "dir/b.py": b"print(1)\n", "dir/sub/c": b"", "dir-x/d": b"d"}
    repo = tmp_path / "r"
    repo.mkdir()
    for rel, data in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    env = {**GIT_ENV}
    import os

    def run(*a: str) -> str:
        return (
            subprocess.run(["git", *a], cwd=repo, env={**os.environ, **env}, capture_output=True, check=True)
            .stdout.decode()
            .strip()
        )

    run("init", "-q")
    run("add", "-A")
    assert tree_id(files) == run("write-tree")


def test_refresh_refuses_a_base_that_is_not_the_pinned_tree(world2: World, cli: Cli) -> None:
    assert cli("--root", str(world2.root), "-q", "checkout", "demo").code == 0
    # the same version re-pinned to another artifact (e.g. a re-uploaded wheel): the worktree's base is stale
    other = make_wheel(world2.root.parent / "other" / world2.wheel.name, {"demo_pkg/__init__.py": b"X = 2\n"})
    world2.write_manifest(
        url=other.as_uri(), sha256=__import__("hashlib").sha256(other.read_bytes()).hexdigest()
    )
    r = cli("--root", str(world2.root), "refresh", "demo")
    assert r.code == 2 and "does not hold the pinned artifact's tree" in r.err and "--force" in r.err


def test_check_hunk_locations_in_memory() -> None:
    from overlay.upstream.astmap import check_hunk_locations

    body = "    p = 0\n    q = 0\n    r = 0\n    x = 1\n    s = 0\n    t = 0\n    u = 0\n"
    base = f"def a():\n{body}    return x\n\n\ndef b():\n    return 0\n"
    patch = parse_patch_bytes(
        make_patch(base, base.replace("    x = 1\n", "    x = 2\n")), name="0001-x.patch"
    )
    assert check_hunk_locations({"f.py": base.encode()}, {"f.py": base.encode()}, [patch]) == []
    # upstream dropped a(), and b() now holds the same lines: with an offset the hunk lands in b()
    target = f"import os\n\n\ndef b():\n{body}    return 0\n"
    moves = check_hunk_locations({"f.py": base.encode()}, {"f.py": target.encode()}, [patch])
    assert [(name, m.before, m.after) for name, m in moves] == [("0001-x.patch", ("a",), ("b",))]


def test_fast_import_gives_checkout_s_commit_ids(tmp_path: Path) -> None:
    """The scratch repository's base commits (one git fast-import) have the ids checkout's commits (git add +
    git commit with the tool's identity) have, odd path names included."""
    from overlay.git import ops as gitops
    from overlay.git.fastimport import import_tree
    from overlay.stack.checkout import write_base_commit
    from overlay.upstream.workspace import prepare

    files = {"pkg/a.py": b"x = 1\n", "dir with space/b.py": b"y = 2\n", '"quoted.py': b"z\n", "e/empty": b""}
    message = "base: demo 1.0\n\ndemo-1.0-py3-none-any.whl\nsha256 " + "0" * 64 + "\n"
    plain = tmp_path / "plain"
    gitops.init(plain)
    expected = write_base_commit(plain, files, message)
    fast = tmp_path / "fast"
    gitops.init(fast)
    assert import_tree(fast, files, message) == expected
    ws = prepare(
        tmp_path / "ws",
        old_files=files,
        old_message=message,
        new_files=files,
        new_message=message,
        patches=(),
        new_version="1.0",
    )
    assert ws.old_base == ws.new_base == expected
    assert sorted(gitops.out(["ls-files"], cwd=ws.repo).splitlines()) == sorted(
        ['"\\"quoted.py"', "dir with space/b.py", "e/empty", "pkg/a.py"]
    )
    assert (ws.repo / "dir with space" / "b.py").read_bytes() == b"y = 2\n"


def test_a_release_with_other_files_is_pinned_whole(tmp_path: Path) -> None:
    """The regex editor could not add or remove an [[upstream.artifacts]] table, so rebase refused such a release."""
    from overlay.core.manifest import Artifact, load_manifest
    from overlay.upstream.rebase import edited_manifest

    src = Path(__file__).resolve().parents[1] / "overlays" / "sglang.toml"
    path = tmp_path / "sglang.toml"
    path.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    manifest = load_manifest(path)
    assert len(manifest.upstream.artifacts) > 1
    new = (Artifact(filename="sglang-0.5.24-py3-none-any.whl", sha256="ab" * 32),)
    text = edited_manifest(manifest, "0.5.24", new, None)
    path.write_text(text, encoding="utf-8")
    moved = load_manifest(path)
    assert moved.upstream.version == "0.5.24"
    assert [a.filename for a in moved.upstream.artifacts] == ["sglang-0.5.24-py3-none-any.whl"]
    assert f"1 files of 0.5.24 (`overlay rebase`; 0.5.23 had {len(manifest.upstream.artifacts)})" in text
    assert (
        text.split("[[upstream.artifacts]]")[0].split("[upstream]")[0]
        == src.read_text(encoding="utf-8").split("[upstream]")[0]
    )  # the rest of the file as it was
