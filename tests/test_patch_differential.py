"""Our patch parser against git's own readers (issue 11, class 8): for every shipped patch, and for a series that
renames, deletes, adds, changes modes and quotes paths, ``series.parse_patch_bytes`` must see what
``git apply --numstat --summary`` sees (files, added/removed line counts, creates, deletes, renames, mode changes) and
what ``git mailinfo`` reads from the mail (author, email, date, subject, message body)."""

from __future__ import annotations

import email.utils
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from overlay.core.series import Patch, parse_patch_bytes
from support import GIT_ENV, World, git, make_world

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(REPO.glob("patches/*/*.patch"))


@dataclass(frozen=True)
class Seen:
    numstat: dict[str, tuple[int, int]]  # path the diff leaves behind -> (added, removed)
    renames: frozenset[tuple[str, str]]
    creates: frozenset[tuple[str, str]]  # (mode, path)
    deletes: frozenset[tuple[str, str]]
    mode_changes: frozenset[tuple[str, str, str]]  # (old, new, path)


def run_git(cwd: Path, *args: str, data: bytes) -> bytes:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, input=data, capture_output=True, env={**os.environ, **GIT_ENV}
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


@pytest.fixture(scope="module")
def scratch_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("git-apply")
    git(repo, "init", "-q")
    return repo


def git_sees(repo: Path, raw: bytes) -> Seen:
    numstat: dict[str, tuple[int, int]] = {}
    renames: set[tuple[str, str]] = set()
    for record in run_git(repo, "apply", "--numstat", "-z", "-", data=raw).split(b"\0"):
        if record:  # `added<TAB>removed<TAB>path`; for a rename, the new path
            added, removed, path = record.split(b"\t", 2)
            numstat[path.decode()] = (int(added), int(removed))
    creates: set[tuple[str, str]] = set()
    deletes: set[tuple[str, str]] = set()
    modes: set[tuple[str, str, str]] = set()
    summary = run_git(repo, "-c", "core.quotePath=false", "apply", "--summary", "-", data=raw).decode()
    for line in summary.splitlines():
        if m := re.fullmatch(r" create mode (\d+) (.+)", line):
            creates.add((m[1], unquote(m[2])))
        elif m := re.fullmatch(r" delete mode (\d+) (.+)", line):
            deletes.add((m[1], unquote(m[2])))
        elif m := re.fullmatch(r" mode change (\d+) => (\d+) (.+)", line):
            modes.add((m[1], m[2], unquote(m[3])))
        elif m := re.fullmatch(r" (?:rename|copy) (.+) \(\d+%\)", line):
            renames.add(rename_sides(m[1]))
        else:
            raise AssertionError(f"summary line we do not compare: {line!r}")
    return Seen(numstat, frozenset(renames), frozenset(creates), frozenset(deletes), frozenset(modes))


def rename_sides(text: str) -> tuple[str, str]:
    """``dir/{old => new}/tail`` (or ``old => new``), as git's summary writes a rename, as (old, new)."""
    if m := re.fullmatch(r"(.*)\{(.*) => (.*)\}(.*)", text):
        pre, a, b, post = m.groups()
        return (pre + a + post).replace("//", "/"), (pre + b + post).replace("//", "/")
    old, new = text.split(" => ")
    return old, new


def unquote(path: str) -> str:
    """git's C-quoting of a path with a space or a quote, which core.quotePath=false leaves in place."""
    if path.startswith('"') and path.endswith('"'):
        return (
            path[1:-1]
            .encode("latin-1", "backslashreplace")
            .decode("unicode_escape")
            .encode("latin-1")
            .decode()
        )
    return path


def we_see(patch: Patch) -> Seen:
    numstat = {}
    for f in patch.files:
        lines = [line.op for h in f.hunks for line in h.lines]
        numstat[f.path] = (lines.count("+"), lines.count("-"))
    return Seen(
        numstat=numstat,
        renames=frozenset(
            (f.old_path or "", f.new_path or "") for f in patch.files if f.kind in ("rename", "copy")
        ),
        creates=frozenset((f.new_mode or "", f.path) for f in patch.files if f.kind == "add"),
        deletes=frozenset((f.old_mode or "", f.path) for f in patch.files if f.kind == "delete"),
        mode_changes=frozenset(
            (f.old_mode, f.new_mode, f.path)
            for f in patch.files
            if f.kind not in ("add", "delete") and f.old_mode and f.new_mode and f.old_mode != f.new_mode
        ),
    )


def mailinfo(tmp: Path, raw: bytes) -> tuple[dict[str, str], str]:
    msg, diff = tmp / "msg", tmp / "patch"
    out = run_git(tmp, "mailinfo", "-u", str(msg), str(diff), data=raw).decode()
    info: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            info[key] = value
    return info, msg.read_text(encoding="utf-8")


def compare(raw: bytes, name: str, repo: Path, tmp: Path) -> Patch:
    patch = parse_patch_bytes(raw, name=name)
    assert we_see(patch) == git_sees(repo, raw), name
    info, message = mailinfo(tmp, raw)
    author, address = email.utils.parseaddr(patch.author)
    assert (author, address) == (info["Author"], info["Email"]), name
    assert patch.date == info["Date"], name
    assert patch.subject == info["Subject"], name
    assert patch.body == message.rstrip("\n"), name
    return patch


def test_the_shipped_patches_exist() -> None:
    assert len(SHIPPED) >= 30  # the three engines' series; a glob that finds nothing would prove nothing


@pytest.mark.parametrize("path", SHIPPED, ids=[f"{p.parent.name}/{p.name[:4]}" for p in SHIPPED])
def test_shipped_patch_agrees_with_git(path: Path, scratch_repo: Path, tmp_path: Path) -> None:
    patch = compare(path.read_bytes(), path.name, scratch_repo, tmp_path)
    assert patch.files and patch.subject


@pytest.fixture
def file_kinds_world(tmp_path: Path) -> World:
    """A series whose patches rename, delete, create, chmod, and touch paths git must quote (space, quote, UTF-8)."""
    world = make_world(tmp_path)
    up, pkg = world.upstream, world.upstream / "python" / "demo_pkg"

    def commit(subject: str) -> None:
        git(up, "add", "-A")
        git(
            up,
            "commit",
            "-q",
            "-m",
            f"{subject}\n\nWhy: {subject}, measured nothing.\n\nOverlay-Theme: other",
        )

    (pkg / "util.py").rename(pkg / "helpers.py")
    commit("util: rename to helpers")
    (pkg / "__init__.py").unlink()
    (pkg / "new module.py").write_text("X = 1\n")
    (pkg / 'quo"te.py').write_text("Y = 2\n")
    (pkg / "caf\u00e9.py").write_text("Z = 3\n")
    commit("files: delete one, add three with names git quotes")
    (pkg / "core.py").chmod(0o755)
    (pkg / "core.py").write_text((pkg / "core.py").read_text().replace('"hello"', '"hi"'))
    (pkg / "helpers.py").chmod(0o755)
    commit("modes: executable core (with an edit) and helpers (mode only)")
    (pkg / "helpers.py").write_text("def double(x):\n    return x + x\n\n\ndef triple(x):\n    return 3 * x")
    commit("helpers: no newline at the end")
    world.export_series()
    return world


def test_file_kinds_agree_with_git(file_kinds_world: World, scratch_repo: Path, tmp_path: Path) -> None:
    patches = [
        compare(p.read_bytes(), p.name, scratch_repo, tmp_path)
        for p in sorted(file_kinds_world.series_dir.glob("*.patch"))
    ]
    kinds = {f.kind for p in patches for f in p.files}
    assert kinds == {"rename", "delete", "add", "modify"}
    assert any(f.old_mode != f.new_mode for p in patches for f in p.files if f.kind == "modify")
    assert {"python/demo_pkg/new module.py", 'python/demo_pkg/quo"te.py', "python/demo_pkg/caf\u00e9.py"} <= {
        f.path for p in patches for f in p.files
    }
