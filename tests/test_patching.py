from __future__ import annotations

from pathlib import Path

import pytest

from overlay.core.patching import DirTree, MemoryTree, apply_patch
from overlay.core.series import load_series
from overlay.errors import ConfigError, IntegrityError, PatchError
from support import CORE_PY, World, git


def tree_with(core: str) -> MemoryTree:
    return MemoryTree(
        {"demo_pkg/core.py": core.encode(), "demo_pkg/util.py": b"def double(x):\n    return 2 * x\n"}
    )


def test_exact_apply_maps_package_root(world2: World) -> None:
    series = load_series(world2.series_dir)
    tree = tree_with(CORE_PY)
    for p in series.patches:
        apply_patch(tree, p, package_root="python")
    assert b'prefix = "hi"' in tree.files["demo_pkg/core.py"]
    assert tree.files["demo_pkg/util.py"] == b"def double(x):\n    return x + x\n"


def test_offset_is_refused_and_named(world2: World) -> None:
    patch = load_series(world2.series_dir).patches[0]
    tree = tree_with("# a new first line\n# and a second\n" + CORE_PY)
    with pytest.raises(PatchError) as exc:
        apply_patch(tree, patch, package_root="python")
    msg = exc.value.message
    assert "does not apply: python/demo_pkg/core.py, hunk #1" in msg and patch.name in msg
    assert "the exact context is at line 6 instead (offset +2); overlay never applies with an offset" in msg
    assert tree.files["demo_pkg/core.py"].startswith(b"# a new first line")  # untouched


def test_fuzz_is_refused_and_named(world2: World) -> None:
    patch = load_series(world2.series_dir).patches[0]
    # the last context line of the hunk (a blank line after `return f"...`) changes: GNU patch would use fuzz 1
    core = CORE_PY.replace(
        '    return f"{prefix}, {name}"\n\n', '    return f"{prefix}, {name}"\n# edge\n', 1
    )
    with pytest.raises(PatchError, match=r"would apply only with fuzz \d"):
        apply_patch(tree_with(core), patch, package_root="python")


def test_mismatch_shows_expected_and_found_lines(world2: World) -> None:
    patch = load_series(world2.series_dir).patches[0]
    core = CORE_PY.replace('prefix = "hello"', 'prefix = "howdy"')
    with pytest.raises(PatchError) as exc:
        apply_patch(tree_with(core), patch, package_root="python")
    msg = exc.value.message
    assert "at line 7" in msg
    assert '-    prefix = "hello"' in msg and '+    prefix = "howdy"' in msg
    assert "offset" not in msg


def test_path_outside_package_root_is_refused(world: World) -> None:
    world.commit_change("README.md", "demo upstream", "demo upstream, patched", "readme: outside the wheel")
    world.export_series()
    patch = load_series(world.series_dir).patches[0]
    with pytest.raises(ConfigError, match="outside the package root 'python'"):
        apply_patch(tree_with(CORE_PY), patch, package_root="python")


def test_add_delete_rename_on_a_directory_tree(world: World, tmp_path: Path) -> None:
    up = world.upstream
    git(up, "mv", "python/demo_pkg/util.py", "python/demo_pkg/helpers.py")
    (up / "python/demo_pkg/new.py").write_text("NEW = True\n")
    git(up, "rm", "-q", "README.md")
    git(up, "add", "-A")
    git(up, "commit", "-q", "-m", "reshape\n\nbody\n")
    world.export_series()
    patch = load_series(world.series_dir).patches[0]
    kinds = sorted(fd.kind for fd in patch.files)
    assert kinds == ["add", "delete", "rename"]
    target = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(up), str(target))
    git(target, "checkout", "-q", world.base_commit)
    apply_patch(DirTree(target), patch)
    assert (target / "python/demo_pkg/helpers.py").is_file() and not (
        target / "python/demo_pkg/util.py"
    ).exists()
    assert (target / "python/demo_pkg/new.py").read_text() == "NEW = True\n"
    assert not (target / "README.md").exists()


def test_symlinked_folder_in_tree_is_not_followed(world2: World, tmp_path: Path) -> None:
    patch = load_series(world2.series_dir).patches[1]
    outside = tmp_path / "outside"
    (outside / "demo_pkg").mkdir(parents=True)
    (outside / "demo_pkg" / "util.py").write_text("def double(x):\n    return 2 * x\n")
    tree_root = tmp_path / "tree" / "python"
    tree_root.parent.mkdir()
    tree_root.symlink_to(outside)
    with pytest.raises(IntegrityError, match="goes through the symlink python"):
        apply_patch(DirTree(tmp_path / "tree"), patch)
    assert (outside / "demo_pkg" / "util.py").read_text().endswith("2 * x\n")


def test_all_files_checked_before_any_write(world: World) -> None:
    pr = "python/demo_pkg/"
    (world.upstream / f"{pr}util.py").write_text("def double(x):\n    return x << 1\n")
    (world.upstream / f"{pr}core.py").write_text(CORE_PY.replace("hello", "hey"))
    git(world.upstream, "add", "-A")
    git(world.upstream, "commit", "-q", "-m", "two files\n\nbody\n")
    world.export_series()
    patch = load_series(world.series_dir).patches[0]
    tree = tree_with(CORE_PY)
    tree.files["demo_pkg/util.py"] = b"def double(x):\n    return 3 * x\n"  # the second file does not match
    before = dict(tree.files)
    with pytest.raises(PatchError, match="util.py"):
        apply_patch(tree, patch, package_root="python")
    assert tree.files == before
