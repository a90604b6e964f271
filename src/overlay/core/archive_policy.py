"""What archive content and patches may put into a tree: the one member policy.

Upstream artifacts are untrusted, even pinned ones (a sha256 pin proves the bytes are the ones we reviewed once, not
that they are harmless). Every wheel, sdist and git-source member, and every path a patch creates, goes through the
checks here before anything is written; a refusal is an IntegrityError (exit 5) naming the archive and the member.

Refused, always:
- a path into a ``.git`` folder at any depth (any component equal to ``.git`` after case folding, trailing dots and
  spaces dropped, as case-insensitive and Windows file systems see it): archive content never writes repository
  control files (a ``.git/config`` with ``core.fsmonitor`` runs a command in the user's shell);
- a member that is not a regular file or a folder: symlink, hardlink, device, fifo, socket, git submodule;
- two members whose names collide after case folding or Unicode (NFC/NFKC) normalisation (on macOS or Windows one
  would overwrite the other).

Refused in a wheel (the pinned upstream wheel, and wheels built from an sdist or git source), unless the manifest's
``upstream.allow-members`` names the allowance:
- a second ``.dist-info`` folder (never allowed);
- a ``.data`` folder (allowance ``"data"``; only the wheel's own ``<dist>-<version>.data``);
- a ``.pth`` file at the install root (allowance ``"pth"``): it runs code at every interpreter start;
- WHEEL ``Tag`` lines that differ from the file name's tags (allowance ``"wheel-tags"``: a release renamed after it
  was built, as vLLM's are; the patched wheel keeps upstream's WHEEL and file name).

Refused in a patch, always: a created or renamed path into ``.git``, a symlink or submodule mode, a path under a
``.dist-info`` or ``.data`` folder, a ``.pth`` file at the wheel root (the upstream artifact is the reference: a patch
changes files upstream has, it never adds installer metadata).
"""

from __future__ import annotations

import stat
import tarfile
import unicodedata
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Literal

from overlay.errors import IntegrityError
from overlay.fsutil import safe_relpath

if TYPE_CHECKING:
    from overlay.core.series.model import Patch

MemberKind = Literal["file", "dir", "symlink", "hardlink", "device", "fifo", "socket", "submodule", "other"]
Allowance = Literal["data", "pth", "wheel-tags"]
ALLOWANCES: tuple[Allowance, ...] = ("data", "pth", "wheel-tags")
SIGNATURES = ("RECORD.jws", "RECORD.p7s")

_KIND_WORDS: dict[str, str] = {
    "symlink": "a symlink",
    "hardlink": "a hardlink",
    "device": "a device",
    "fifo": "a fifo",
    "socket": "a socket",
    "submodule": "a git submodule",
    "other": "not a regular file or folder",
}


@dataclass(frozen=True)
class MemberPolicy:
    """Which otherwise-refused wheel members the manifest allows (``upstream.allow-members``)."""

    allow: frozenset[str] = frozenset()

    @classmethod
    def of(cls, allow: Iterable[str]) -> MemberPolicy:
        return cls(allow=frozenset(allow))


STRICT = MemberPolicy()


def _fold(name: str) -> str:
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


def is_control_part(part: str) -> bool:
    """A path component that is a ``.git`` folder as some file system sees it (``.GIT``, ``.git.``, ``.git ``)."""
    return _fold(part.rstrip(". ")) == ".git"


def check_control(rel: str, *, where: str, what: str = "archive member") -> None:
    """Refuse a path with a ``.git`` component: repository control files never come from archive or patch content."""
    for part in rel.split("/"):
        if is_control_part(part):
            raise IntegrityError(
                f"{where}: {what} {rel!r} is inside a {part!r} folder; repository control files are never taken "
                "from archive content",
                tip="the artifact is not a plain release: check where it came from before pinning it",
            )


def check_member_name(name: str, *, where: str, what: str = "archive member") -> PurePosixPath:
    """A member name as a safe relative path: relative, no ``..``, no ``.git`` component."""
    rel = safe_relpath(name, what=f"{where}: {what}")
    check_control(str(rel), where=where, what=what)
    return rel


def check_kind(kind: MemberKind, name: str, *, where: str) -> None:
    if kind not in ("file", "dir"):
        raise IntegrityError(
            f"{where}: archive member {name!r} is {_KIND_WORDS.get(kind, kind)}; only regular files and folders "
            "are accepted",
            tip="links and special files in a release archive can write outside the tree; use another artifact",
        )


def zip_kind(info: zipfile.ZipInfo) -> MemberKind:
    """The file type of a zip member from the Unix mode in ``external_attr`` (0: a plain file or folder)."""
    mode = (info.external_attr >> 16) & 0xFFFF
    fmt = stat.S_IFMT(mode)
    if fmt == 0:
        return "dir" if info.filename.endswith("/") or info.external_attr & 0x10 else "file"
    if stat.S_ISREG(fmt):
        return "file"
    if stat.S_ISDIR(fmt):
        return "dir"
    if stat.S_ISLNK(fmt):
        return "symlink"
    if stat.S_ISCHR(fmt) or stat.S_ISBLK(fmt):
        return "device"
    if stat.S_ISFIFO(fmt):
        return "fifo"
    if stat.S_ISSOCK(fmt):
        return "socket"
    return "other"


def tar_kind(member: tarfile.TarInfo) -> MemberKind:
    if member.isfile():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    if member.ischr() or member.isblk():
        return "device"
    if member.isfifo():
        return "fifo"
    return "other"


def git_kind(mode: str) -> MemberKind:
    """The file type of a git tree entry from its mode (``git ls-tree``)."""
    if mode in ("100644", "100755", "100664"):
        return "file"
    if mode == "040000":
        return "dir"
    if mode == "120000":
        return "symlink"
    if mode == "160000":
        return "submodule"
    return "other"


class NameSet:
    """File names seen so far in one archive; refuses a repeat and a collision after case folding / normalisation."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._seen: dict[str, str] = {}
        self._exact: set[str] = set()

    def add(self, rel: str, *, raw: str | None = None) -> None:
        shown = raw if raw is not None else rel
        if rel in self._exact:
            raise IntegrityError(
                f"{self.where}: archive member {shown!r} appears twice",
                tip="a well-formed archive names each file once; use another artifact",
            )
        key = _fold(rel)
        other = self._seen.get(key)
        if other is not None:
            raise IntegrityError(
                f"{self.where}: archive member {shown!r} collides with {other!r} after case folding or Unicode "
                "normalisation; on a case-insensitive or normalising file system one would overwrite the other",
                tip="use another artifact; an upstream release never needs both names",
            )
        self._exact.add(rel)
        self._seen[key] = rel


def check_members(
    members: Iterable[tuple[str, MemberKind]], *, where: str
) -> list[tuple[str, PurePosixPath]]:
    """Check every (name, kind) of an archive; return the regular files as (name, safe path). Raises on the first
    refused member, before the caller writes anything."""
    names = NameSet(where)
    files: list[tuple[str, PurePosixPath]] = []
    for name, kind in members:
        rel = check_member_name(name.rstrip("/") if kind == "dir" else name, where=where)
        check_kind(kind, name, where=where)
        if kind == "file":
            names.add(str(rel), raw=name)
            files.append((name, rel))
    return files


def check_wheel_layout(
    paths: Iterable[str], *, dist_info: str, where: str, policy: MemberPolicy = STRICT
) -> None:
    """Refuse a second ``.dist-info`` folder, a ``.data`` folder and a root ``.pth`` unless ``policy`` allows them."""
    own_data = dist_info[: -len(".dist-info")] + ".data"
    for path in sorted(paths):
        problem = wheel_path_problem(path, dist_info=dist_info, own_data=own_data, policy=policy)
        if problem:
            raise IntegrityError(
                f"{where}: archive member {path!r} {problem}",
                tip="if the upstream release really ships it, say so in the manifest: "
                'upstream.allow-members = ["data"] or ["pth"] (docs/commands/apply.md)',
            )


def wheel_path_problem(
    path: str, *, dist_info: str | None, own_data: str | None, policy: MemberPolicy
) -> str | None:
    top, _, rest = path.partition("/")
    if top.endswith(".dist-info") and top != dist_info:
        return f"is in a second .dist-info folder {top!r} (the wheel's own is {dist_info!r})"
    if top.endswith(".data"):
        if top != own_data:
            return f"is in a .data folder {top!r} that is not the wheel's own ({own_data!r})"
        if "data" not in policy.allow:
            return f"is in the .data folder {top!r}; its files install outside the package (scripts, headers, data)"
        sub, _, inner = rest.partition("/")
        if (
            sub in ("purelib", "platlib")
            and "/" not in inner
            and inner.endswith(".pth")
            and "pth" not in policy.allow
        ):
            return "is a .pth file: it runs code at every interpreter start"
        return None
    if not rest and top.endswith(".pth") and "pth" not in policy.allow:
        return "is a .pth file: it runs code at every interpreter start"
    return None


def patch_problems(patch: Patch, *, package_root: str) -> list[tuple[str, str]]:
    """(path, problem) for each path of ``patch`` the policy refuses. Paths are repo-root paths; those under
    ``package_root`` are judged in the wheel layout (the prefix stripped)."""
    problems: list[tuple[str, str]] = []
    prefix = package_root.strip("/") + "/" if package_root.strip("/") else ""
    for fd in patch.files:
        for path in fd.paths:
            if any(is_control_part(part) for part in path.split("/")):
                problems.append(
                    (path, "is inside a .git folder; a patch never writes repository control files")
                )
        if fd.new_mode in ("120000", "160000"):
            problems.append(
                (fd.path, "has mode " + fd.new_mode + " (a symlink or submodule); patches add regular files")
            )
        creates = fd.kind in ("add", "rename", "copy") and fd.new_path is not None
        if not creates or fd.new_path is None or (prefix and not fd.new_path.startswith(prefix)):
            continue
        top, _, rest = fd.new_path[len(prefix) :].partition("/")
        if top.endswith((".dist-info", ".data")) and rest:
            folder = "dist-info" if top.endswith(".dist-info") else "data"
            problems.append(
                (
                    fd.new_path,
                    (
                        f"is in a .{folder} folder ({top!r}); a patch never adds installer metadata "
                        "or a second distribution"
                    ),
                )
            )
        elif not rest and top.endswith(".pth"):
            problems.append(
                (
                    fd.new_path,
                    ("is a .pth file at the wheel root: it would run code at every interpreter start"),
                )
            )
    return problems


def check_patch(patch: Patch, *, package_root: str) -> None:
    problems = patch_problems(patch, package_root=package_root)
    if problems:
        path, problem = problems[0]
        raise IntegrityError(
            f"patch {patch.name}: path {path!r} {problem}",
            tip="drop that file from the patch (`overlay checkout`, amend the commit, `overlay refresh`)",
        )


def check_patches(patches: Iterable[Patch], *, package_root: str) -> None:
    for patch in patches:
        check_patch(patch, package_root=package_root)
