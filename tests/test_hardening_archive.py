"""Archive content is untrusted (issue 11, class 1): hostile wheels, sdists, git sources and patches are refused with
exit 5 naming the member, before anything is written."""

from __future__ import annotations

import hashlib
import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from overlay.core.sources import safe_extract_tar
from overlay.errors import IntegrityError
from support import TRAILERS, Cli, World, git, make_wheel

PKG = {
    "demo_pkg/__init__.py": b"from demo_pkg.core import greet\n",
    "demo_pkg/core.py": b"def greet(name):\n    return name\n",
}


def _member(name: str, mode: int = stat.S_IFREG | 0o644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2026, 1, 2, 3, 4, 5))
    info.create_system = 3
    info.external_attr = mode << 16
    return info


def _pin_hostile_wheel(
    world: World, extra: list[tuple[zipfile.ZipInfo, bytes]], files: dict[str, bytes] | None = None
) -> None:
    """Replace the pinned release wheel by a hostile one and pin its sha256, as if upstream had published it."""
    world.wheel.unlink()
    make_wheel(world.wheel, files or PKG, extra_members=extra)
    world.write_manifest()


def _nothing_written(world: World) -> None:
    build = world.root / "build"
    assert not list((build / "wheels").rglob("*.whl")) if (build / "wheels").exists() else True
    assert not (build / "worktrees" / "demo").exists()
    tmp = build / "tmp"
    assert not tmp.exists() or not [p for p in tmp.iterdir() if p.is_dir()]


HOSTILE = [
    pytest.param(
        [(_member(".git/config"), b"[core]\n\tfsmonitor = touch /tmp/pwned\n")],
        ".git/config",
        "inside a",
        id="git-config",
    ),
    pytest.param(
        [(_member("demo_pkg/.GIT/hooks/x"), b"#!/bin/sh\n")],
        "demo_pkg/.GIT/hooks/x",
        "inside a",
        id="nested-GIT-casefold",
    ),
    pytest.param(
        [(_member("demo_pkg/link", stat.S_IFLNK | 0o777), b"/etc/passwd")],
        "demo_pkg/link",
        "is a symlink",
        id="symlink",
    ),
    pytest.param(
        [(_member("demo_pkg/fifo", stat.S_IFIFO | 0o644), b"")], "demo_pkg/fifo", "is a fifo", id="fifo"
    ),
    pytest.param(
        [(_member("demo_pkg/dev", stat.S_IFCHR | 0o644), b"")], "demo_pkg/dev", "is a device", id="device"
    ),
    pytest.param(
        [(_member("demo_pkg/A.py"), b"A = 1\n"), (_member("demo_pkg/a.py"), b"a = 1\n")],
        "demo_pkg/a.py",
        "collides with 'demo_pkg/A.py'",
        id="casefold-collision",
    ),
    pytest.param(
        [(_member("demo_pkg/caf\u00e9.py"), b"x = 1\n"), (_member("demo_pkg/cafe\u0301.py"), b"x = 2\n")],
        "demo_pkg/cafe\u0301.py",
        "Unicode",
        id="nfc-nfd-collision",
    ),
    pytest.param(
        [(_member("evil-1.0.dist-info/METADATA"), b"Name: evil\n")],
        "evil-1.0.dist-info/METADATA",
        "second .dist-info",
        id="second-dist-info",
    ),
    pytest.param(
        [(_member("demo_engine-1.2.0.data/scripts/run"), b"#!/bin/sh\n")],
        "demo_engine-1.2.0.data/scripts/run",
        ".data folder",
        id="data-folder",
    ),
    pytest.param(
        [(_member("zzz-evil.pth"), b"import os; os.system('touch /tmp/pwned')\n")],
        "zzz-evil.pth",
        ".pth file",
        id="pth",
    ),
]


@pytest.mark.parametrize(("extra", "member", "why"), HOSTILE)
def test_pinned_hostile_wheel_is_refused_by_apply_and_checkout(
    world: World, cli: Cli, extra: list[tuple[zipfile.ZipInfo, bytes]], member: str, why: str
) -> None:
    _pin_hostile_wheel(world, extra)
    for argv in (["apply", "demo"], ["checkout", "demo"], ["lint", "demo"]):
        r = cli("--root", str(world.root), *argv)
        assert r.code == 5, (argv, r.err)
        assert repr(member) in r.err and why in r.err, r.err
        _nothing_written(world)


def test_manifest_allowance_admits_the_wheels_own_data_folder(world: World, cli: Cli, tmp_path: Path) -> None:
    _pin_hostile_wheel(
        world, [], files={**PKG, "demo_engine-1.2.0.data/scripts/demo-run": b"#!/bin/sh\necho hi\n"}
    )
    text = world.manifest_text().replace(
        'package-root = "python"\n', 'package-root = "python"\nallow-members = ["data"]\n'
    )
    (world.root / "overlays" / "demo.toml").write_text(text)
    r = cli("--root", str(world.root), "-q", "apply", "demo", "--out", str(tmp_path / "out"))
    assert r.code == 0, r.err
    with zipfile.ZipFile(r.out.strip()) as zf:
        assert any(n.endswith(".data/scripts/demo-run") for n in zf.namelist())
    # another .data folder, or a .pth, stays refused
    _pin_hostile_wheel(world, [], files={**PKG, "other-1.0.data/scripts/x": b"x"})
    (world.root / "overlays" / "demo.toml").write_text(
        world.manifest_text().replace(
            'package-root = "python"\n', 'package-root = "python"\nallow-members = ["data"]\n'
        )
    )
    r = cli("--root", str(world.root), "apply", "demo")
    assert r.code == 5 and "'other-1.0.data/scripts/x'" in r.err
    (world.root / "overlays" / "demo.toml").write_text(
        world.manifest_text().replace(
            'package-root = "python"\n', 'package-root = "python"\nallow-members = ["exe"]\n'
        )
    )
    r = cli("--root", str(world.root), "apply", "demo")
    assert r.code == 2 and "'exe' is not one of data, pth" in r.err


def test_checkout_never_writes_control_files_even_from_a_tree(world: World, tmp_path: Path) -> None:
    from overlay.stack.checkout import write_base_commit

    repo = tmp_path / "wt"
    repo.mkdir()
    with pytest.raises(IntegrityError, match=r"'python/\.Git/config' is inside a '\.Git' folder"):
        write_base_commit(repo, {"python/ok.py": b"x", "python/.Git/config": b"[core]\n"}, "base")
    assert not (repo / "python").exists()  # checked before the first file is written


# ---------------------------------------------------------------- sdists


def _tar(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        ok = b"x = 1\n"
        info = tarfile.TarInfo("demo-engine-1.2.0/demo_pkg/__init__.py")
        info.size = len(ok)
        tf.addfile(info, io.BytesIO(ok))
        for m in members:
            tf.addfile(m, io.BytesIO(b"y" * m.size) if m.isfile() else None)
    return path


def _tinfo(name: str, kind: bytes, *, linkname: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = size
    return info


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_tinfo("demo-engine-1.2.0/demo_pkg/link", tarfile.SYMTYPE, linkname="/etc/passwd"), "is a symlink"),
        (
            _tinfo(
                "demo-engine-1.2.0/demo_pkg/hard",
                tarfile.LNKTYPE,
                linkname="demo-engine-1.2.0/demo_pkg/__init__.py",
            ),
            "is a hardlink",
        ),
        (_tinfo("demo-engine-1.2.0/demo_pkg/dev", tarfile.CHRTYPE), "is a device"),
        (_tinfo("demo-engine-1.2.0/demo_pkg/fifo", tarfile.FIFOTYPE), "is a fifo"),
        (_tinfo("demo-engine-1.2.0/.git/config", tarfile.REGTYPE, size=4), "inside a '.git' folder"),
        (_tinfo("demo-engine-1.2.0/demo_pkg/__INIT__.py", tarfile.REGTYPE, size=4), "collides with"),
    ],
    ids=["symlink", "hardlink", "device", "fifo", "git-config", "casefold"],
)
def test_sdist_hostile_members_are_refused_before_extraction(
    tmp_path: Path, member: tarfile.TarInfo, why: str
) -> None:
    archive = _tar(tmp_path / "demo-engine-1.2.0.tar.gz", [member])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(IntegrityError, match=why) as exc:
        safe_extract_tar(archive, dest)
    assert repr(member.name) in exc.value.message
    assert not list(dest.iterdir())  # nothing extracted, not even the good member


def test_pinned_sdist_with_a_symlink_exits_5(world: World, cli: Cli, tmp_path: Path) -> None:
    bad = _tar(
        tmp_path / "demo-engine-1.2.0.tar.gz",
        [_tinfo("demo-engine-1.2.0/demo_pkg/link", tarfile.SYMTYPE, linkname="../../../../etc/passwd")],
    )
    world.write_manifest(
        filename=bad.name, sha256=hashlib.sha256(bad.read_bytes()).hexdigest(), url=bad.as_uri()
    )
    r = cli("--root", str(world.root), "apply", "demo")
    assert r.code == 5 and "'demo-engine-1.2.0/demo_pkg/link' is a symlink" in r.err
    _nothing_written(world)


# ---------------------------------------------------------------- git source


def test_git_source_with_a_symlink_under_the_package_root_is_refused(world: World, cli: Cli) -> None:
    link = world.upstream / "python" / "demo_pkg" / "secrets"
    link.symlink_to("/etc/passwd")
    git(world.upstream, "add", "-A")
    git(world.upstream, "commit", "-q", "-m", "add a link")
    commit = git(world.upstream, "rev-parse", "HEAD")
    r = cli("--root", str(world.root), "apply", "demo", "--source", "git", "--commit", commit)
    assert r.code == 5, r.err
    assert "'python/demo_pkg/secrets' is a symlink" in r.err
    _nothing_written(world)


# ---------------------------------------------------------------- what patches add


def _add_file_patch(world: World, rel: str, data: bytes = b"Name: evil\n") -> None:
    path = world.upstream / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    git(world.upstream, "add", "-A", "-f")
    git(world.upstream, "commit", "-q", "-m", f"add {rel}\n\nAdds {rel} to the tree.\n\n{TRAILERS}")
    world.export_series()


@pytest.mark.parametrize(
    ("rel", "why"),
    [
        ("python/evil-1.0.dist-info/METADATA", "is in a .dist-info folder"),
        ("python/demo_engine-1.2.0.data/scripts/x", "is in a .data folder"),
        ("python/evil.pth", "is a .pth file"),
    ],
    ids=["dist-info", "data", "pth"],
)
def test_patch_adding_installer_metadata_is_refused(world: World, cli: Cli, rel: str, why: str) -> None:
    _add_file_patch(world, rel)
    name = next(world.series_dir.glob("*.patch")).name
    r = cli("--root", str(world.root), "apply", "demo")
    assert r.code == 5, r.err
    assert f"patch {name}: path {rel!r} {why}" in r.err
    _nothing_written(world)
    lint = cli("--root", str(world.root), "lint", "demo")
    assert lint.code == 5 and name in lint.err and rel in lint.err


def test_patch_into_a_git_folder_is_refused(world: World, cli: Cli) -> None:
    _add_file_patch(world, "python/demo_pkg/newfile.py", b"x = 1\n")
    patch = next(world.series_dir.glob("*.patch"))
    patch.write_bytes(patch.read_bytes().replace(b"demo_pkg/newfile.py", b"demo_pkg/.git/config"))
    r = cli("--root", str(world.root), "apply", "demo")
    assert r.code == 5, r.err
    assert patch.name in r.err and "'python/demo_pkg/.git/config'" in r.err and ".git folder" in r.err
    r = cli("--root", str(world.root), "checkout", "demo")
    assert r.code == 5 and ".git folder" in r.err
    _nothing_written(world)


def test_patch_adding_an_ordinary_file_still_builds(world: World, cli: Cli, tmp_path: Path) -> None:
    _add_file_patch(world, "python/demo_pkg/extra.py", b"EXTRA = 1\n")
    r = cli("--root", str(world.root), "-q", "apply", "demo", "--out", str(tmp_path))
    assert r.code == 0, r.err
    with zipfile.ZipFile(r.out.strip()) as zf:
        assert zf.read("demo_pkg/extra.py") == b"EXTRA = 1\n"


def test_patch_policy_holds_without_the_parser(tmp_path: Path) -> None:
    """The policy does not rely on the patch parser: a Patch built directly is judged the same in apply_patch."""
    from overlay.core.patching import MemoryTree, apply_patch
    from overlay.core.series import FileDiff, Patch

    def patch_with(fd: FileDiff) -> Patch:
        return Patch(
            name="0001-x.patch",
            raw=b"",
            author="a <a@b>",
            date="",
            subject="x",
            body="",
            trailers=(),
            files=(fd,),
        )

    cases = [
        (
            FileDiff("add", None, "python/demo_pkg/.Git/config", None, "100644", None, None, ()),
            "inside a .git folder",
        ),
        (FileDiff("add", None, "python/demo_pkg/link", None, "120000", None, None, ()), "has mode 120000"),
        (
            FileDiff(
                "rename",
                "python/demo_pkg/a.py",
                "python/evil-1.0.dist-info/RECORD",
                "100644",
                "100644",
                None,
                None,
                (),
            ),
            "is in a .dist-info folder",
        ),
    ]
    for fd, why in cases:
        tree = MemoryTree({"demo_pkg/a.py": b"x\n"})
        with pytest.raises(IntegrityError, match=why):
            apply_patch(tree, patch_with(fd), package_root="python")
        assert tree.files == {"demo_pkg/a.py": b"x\n"}
