"""The scratch repository of a replay (:mod:`overlay.upstream.replay`): both upstream trees as root commits made with
the tool's fixed identity, the old series as commits on the old tree (branch ``old``), the new tree checked out
(branch ``rebased``); and the git reads and resets a replay does there."""

from __future__ import annotations

import email.utils
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from overlay.core.patching import MemoryTree, apply_patch
from overlay.core.series import Patch
from overlay.errors import ExternalCommandError, PatchError
from overlay.git import ops as gitops
from overlay.git.fastimport import (
    BASE_DATE,
    Stream,
    cleaned_message,
    path_bytes,
    run_stream,
    tool_ident,
    whole_tree,
)
from overlay.progress import NullReporter, Reporter
from overlay.stack.checkout import FORMAT_PATCH_ARGS


@dataclass
class Workspace:
    """The scratch repository of one replay (see the module docstring)."""

    repo: Path
    old_base: str
    new_base: str
    old_commits: tuple[str, ...]
    new_version: str
    renames: dict[str, tuple[str, int]] = field(default_factory=dict)  # old path -> (new path, similarity %)

    def head(self) -> str:
        return gitops.out(["rev-parse", "HEAD"], cwd=self.repo)


def _patch_ident(patch: Patch) -> tuple[str, str]:
    name, addr = email.utils.parseaddr(patch.author)
    date = patch.date or BASE_DATE
    return f"{name or addr} <{addr}>", date


def _root_commit(stream: Stream, ref: str, tool: str, message: str, files: dict[str, bytes]) -> int:
    """An upstream tree as a root commit with the tool's fixed identity and date (the id ``overlay checkout`` gives it)."""
    return stream.commit(
        ref,
        author=tool,
        author_date=BASE_DATE,
        committer=tool,
        committer_date=BASE_DATE,
        message=cleaned_message(message),
        parent=None,
        changes=whole_tree(stream, files),
    )


def prepare(
    repo: Path,
    *,
    old_files: dict[str, bytes],
    old_message: str,
    new_files: dict[str, bytes],
    new_message: str,
    patches: Sequence[Patch],
    new_version: str,
    reporter: Reporter | None = None,
) -> Workspace:
    """Make the scratch repository: old tree + old series (branch ``old``), new tree checked out (branch ``rebased``).

    Everything is written by one ``git fast-import``: the two trees as root commits with the tool's fixed identity
    (the ids ``overlay checkout`` gives them), and the old series applied exactly, in memory, one commit per patch
    with the patch's author, date and message. Only the new tree is then checked out.
    """
    reporter = reporter or NullReporter()
    gitops.init(repo)
    gitops.run(["config", "rerere.enabled", "false"], cwd=repo)
    gitops.run(["config", "merge.conflictStyle", "diff3"], cwd=repo)
    tool = tool_ident()
    stream = Stream()
    old_mark = _root_commit(stream, "refs/heads/old", tool, old_message, old_files)
    tree = MemoryTree(dict(old_files))
    marks: list[int] = []
    parent = old_mark
    for patch in patches:
        try:
            applied = apply_patch(tree, patch)
        except PatchError as exc:
            raise PatchError(
                exc.message,
                tip="the series must apply exactly at the pinned base before a rebase: "
                "run `overlay lint` and fix it first",
            ) from None
        changes: list[bytes] = []
        for fd, af in zip(patch.files, applied.files):
            if fd.kind == "rename" and fd.old_path and fd.old_path != af.path:
                changes.append(b"D %s\n" % path_bytes(fd.old_path))
            if af.kind == "delete":
                changes.append(b"D %s\n" % path_bytes(af.path))
            else:
                data = tree.read(af.path) or b""
                mode = b"100755" if tree.is_executable(af.path) else b"100644"
                changes.append(b"M %s :%d %s\n" % (mode, stream.blob(data), path_bytes(af.path)))
        author, date = _patch_ident(patch)
        parent = stream.commit(
            "refs/heads/old",
            author=author,
            author_date=date,
            committer=tool,
            committer_date=date,
            message=patch.subject + ("\n\n" + patch.body if patch.body else "") + "\n",
            parent=parent,
            changes=changes,
        )
        marks.append(parent)
    new_mark = _root_commit(stream, "refs/heads/rebased", tool, new_message, new_files)
    stream.ref("refs/tags/overlay/old-base", old_mark)
    stream.ref("refs/tags/overlay/new-base", new_mark)
    ids = run_stream(repo, stream)
    gitops.run(["symbolic-ref", "HEAD", "refs/heads/rebased"], cwd=repo)
    gitops.run(["reset", "-q", "--hard", "refs/heads/rebased"], cwd=repo)
    reporter.step(
        "rebase",
        f"scratch repository ready: {len(old_files)} -> {len(new_files)} files, {len(patches)} patches",
    )
    ws = Workspace(
        repo=repo,
        old_base=ids[old_mark],
        new_base=ids[new_mark],
        old_commits=tuple(ids[m] for m in marks),
        new_version=new_version,
    )
    ws.renames = upstream_renames(repo, ws.old_base, ws.new_base)
    return ws


def upstream_renames(repo: Path, old: str, new: str) -> dict[str, tuple[str, int]]:
    """Files git sees renamed between two trees: old path -> (new path, similarity %)."""
    raw = gitops.run(["diff", "-M", "--name-status", "-z", "--diff-filter=R", old, new], cwd=repo).stdout
    parts = raw.decode("utf-8", "surrogateescape").split("\0")
    out: dict[str, tuple[str, int]] = {}
    i = 0
    while i + 2 < len(parts) and parts[i]:
        status, a, b = parts[i], parts[i + 1], parts[i + 2]
        out[a] = (b, int(status[1:] or 0))
        i += 3
    return out


def read_blobs(repo: Path, specs: Sequence[str]) -> list[bytes | None]:
    """Contents of ``rev:path`` specs in one ``git cat-file --batch`` call (None for a missing one)."""
    if not specs:
        return []
    raw = gitops.run(
        ["cat-file", "--batch"], cwd=repo, input="".join(s + "\n" for s in specs).encode()
    ).stdout
    out: list[bytes | None] = []
    pos = 0
    for _spec in specs:
        eol = raw.index(b"\n", pos)
        header = raw[pos:eol].split()
        pos = eol + 1
        if len(header) < 3 or header[1] != b"blob":
            out.append(None)
            continue
        size = int(header[2])
        out.append(raw[pos : pos + size])
        pos += size + 1
    return out


def commit_patch_bytes(repo: Path, commit: str) -> bytes:
    return gitops.run([*FORMAT_PATCH_ARGS, "-1", "--stdout", commit], cwd=repo).stdout


def same_diff(repo: Path, a: str, b: str) -> bool:
    """Whether two commits make byte-identical changes (same paths, same blobs before and after)."""
    out = gitops.run(
        ["diff-tree", "--stdin", "-p", "-M", "--full-index"], cwd=repo, input=f"{a}\n{b}\n".encode()
    ).stdout
    head_b = out.find(b"\n" + b.encode() + b"\n")
    if not out.startswith(a.encode() + b"\n") or head_b < 0:
        raise ExternalCommandError(f"git diff-tree --stdin gave unexpected output for {a[:12]} {b[:12]}")
    return out[len(a) + 1 : head_b + 1] == out[head_b + len(b) + 2 :]


def clear_pick_state(repo: Path) -> None:
    for name in ("CHERRY_PICK_HEAD", "MERGE_MSG", "AUTO_MERGE"):
        (repo / ".git" / name).unlink(missing_ok=True)
    gitops.run(["cherry-pick", "--quit"], cwd=repo, check=False)


def discard_attempt(repo: Path) -> None:
    """Throw away whatever a stopped patch left in the work tree and index."""
    gitops.run(["reset", "-q", "--hard", "HEAD"], cwd=repo)
    gitops.run(["clean", "-q", "-f", "-d"], cwd=repo)
    clear_pick_state(repo)
