from __future__ import annotations

from collections.abc import Callable

import pytest

from overlay.core.series import check_trailers, load_series, parse_patch, parse_patch_bytes
from overlay.errors import ConfigError, IntegrityError
from support import World, git


def test_parses_format_patch_headers_trailers_and_hunks(world2: World) -> None:
    series = load_series(world2.series_dir)
    assert series.engine == "demo" and series.base_commit == world2.base_commit
    first, second = series.patches
    assert first.subject == "core: shorter greeting"
    assert first.author == "Test Author <author@example.com>"
    assert first.theme == "other" and first.numerics == "exact" and first.upstream_status == "Pending"
    assert check_trailers(first) == []
    (fd,) = first.files
    assert fd.kind == "modify" and fd.old_path == fd.new_path == "python/demo_pkg/core.py"
    assert len(fd.old_blob or "") == 40  # --full-index
    (hunk,) = fd.hunks
    assert hunk.old_start == 4 and hunk.section == '__version__ = "1.2.0"'
    assert [line.op for line in hunk.lines].count("-") == 1
    assert b'    prefix = "hi"\n' in hunk.new_lines
    assert second.paths == ("python/demo_pkg/util.py",)


def test_no_newline_at_end_of_file_and_new_and_deleted_files(world: World) -> None:
    up = world.upstream
    (up / "python/demo_pkg/util.py").write_text("def double(x):\n    return 2 * x")  # drop final newline
    (up / "python/demo_pkg/extra.py").write_text("X = 1\n")
    (up / "README.md").unlink()
    git(up, "add", "-A")
    git(up, "commit", "-q", "-m", "edit\n\nbody\n\nOverlay-Theme: other\n")
    names = world.export_series()
    patch = parse_patch(world.series_dir / names[0])
    kinds = {fd.path: fd.kind for fd in patch.files}
    assert kinds == {
        "README.md": "delete",
        "python/demo_pkg/extra.py": "add",
        "python/demo_pkg/util.py": "modify",
    }
    util = next(fd for fd in patch.files if fd.path.endswith("util.py"))
    assert util.hunks[0].new_lines[-1] == b"    return 2 * x"  # no newline kept


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (
            lambda t: t.replace(b"@@ -4,7 +4,7 @@", b"@@ -4,9 +4,9 @@"),
            ConfigError,
            r"hunk says -9 \+9 lines but has",
        ),
        (lambda t: t.split(b"@@ -4")[0] + b"@@ -4,7 +4,7 @@\n def x():\n", ConfigError, r"truncated patch"),
        (
            lambda t: t.replace(b"a/python/demo_pkg/core.py", b"a/../escape.py"),
            IntegrityError,
            r"contains '\.\.'",
        ),
        (lambda t: t.replace(b"b/python/demo_pkg/core.py", b"b//etc/passwd"), IntegrityError, r"absolute"),
        (lambda t: t.replace(b"index ", b"new mode 120000\nindex ", 1), IntegrityError, r"is a symlink"),
        (lambda t: t.replace(b"From 0000", b"Frim 0000"), ConfigError, r"not a git format-patch file"),
        (lambda t: t.replace(b"\n@@ -4,7", b"\n@@ -x,7"), ConfigError, r"malformed hunk header"),
        (
            lambda t: t.replace(b"a/python/demo_pkg/core.py b/", b"a/.git/config b/", 1),
            IntegrityError,
            r"\.git",
        ),
    ],
)
def test_malformed_or_unsafe_patches_are_refused(
    world2: World, mutate: Callable[[bytes], bytes], error: type[Exception], message: str
) -> None:
    path = sorted(world2.series_dir.glob("0001-*.patch"))[0]
    raw = path.read_bytes()
    assert b"@@ -4,7 +4,7 @@" in raw
    with pytest.raises(error, match=message):
        parse_patch_bytes(mutate(raw), name=path.name)


def test_binary_diff_refused(world: World) -> None:
    (world.upstream / "python/demo_pkg/native.so").write_bytes(b"\x00\x01new")
    git(world.upstream, "add", "-A")
    git(world.upstream, "commit", "-q", "-m", "bin\n\nb\n")
    git(world.upstream, "format-patch", "--binary", "-o", str(world.series_dir), f"{world.base_commit}..HEAD")
    path = sorted(world.series_dir.glob("*.patch"))[0]
    with pytest.raises(ConfigError, match="binary diffs are not supported"):
        parse_patch(path)


def test_series_and_folder_must_agree(world2: World) -> None:
    series = world2.series_dir / "series"
    text = series.read_text()
    extra = world2.series_dir / "0009-stray.patch"
    extra.write_bytes(sorted(world2.series_dir.glob("0001-*.patch"))[0].read_bytes())
    with pytest.raises(ConfigError, match="0009-stray.patch is not listed in series"):
        load_series(world2.series_dir)
    extra.unlink()
    series.write_text(text + "0003-missing.patch\n")
    with pytest.raises(ConfigError, match="names '0003-missing.patch', but there is no such file"):
        load_series(world2.series_dir)
    first = text.splitlines()[1]
    series.write_text(text + first + "\n")
    with pytest.raises(ConfigError, match="is listed twice"):
        load_series(world2.series_dir)
    series.write_text("0001-x.patch\n")
    with pytest.raises(ConfigError, match="first line must be `# base: ENGINE VERSION COMMIT`"):
        load_series(world2.series_dir)


def test_trailer_validation(world2: World) -> None:
    path = sorted(world2.series_dir.glob("0001-*.patch"))[0]
    raw = path.read_bytes()
    bad = raw.replace(b"Overlay-Numerics: exact", b"Overlay-Numerics: close").replace(
        b"Upstream-Status: Pending", b"Upstream-Status: Submitted"
    )
    problems = check_trailers(parse_patch_bytes(bad, name=path.name))
    assert any("Overlay-Numerics 'close'" in p for p in problems)
    assert any("Submitted needs a URL" in p for p in problems)
    missing = raw.replace(b"Overlay-Check: tests/test_demo.py::test_demo\n", b"")
    assert "missing trailer Overlay-Check:" in check_trailers(parse_patch_bytes(missing, name=path.name))
