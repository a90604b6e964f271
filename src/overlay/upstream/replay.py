"""Replay a series from one upstream tree onto another, classifying every patch (the engine of rebase and review).

A scratch git repository holds both upstream trees as root commits made with the tool's fixed identity (so the old
one has the id ``overlay checkout`` gives the pinned base, and the new one the id it will give once the new release
is pinned), the old series as commits on the old tree, and the rebased series as commits on the new tree. Each patch
is tried, in this order:

``obsolete``   a file it changes is gone from the new tree (git's rename detection names where it went);
``clean``      it applies exactly, at the same lines;
``offset``     it applies exactly (every context line), at other lines;
``upstreamed`` its reverse applies (exactly or at other lines): the new tree already contains the change;
``merged``     a real 3-way merge (``git cherry-pick``: base = the old tree with the earlier patches, ours = the new
               tree with the earlier rebased patches, theirs = the patch's commit) resolves it;
``upstreamed`` that merge leaves nothing to commit: upstream made an equivalent change;
``conflict``   that merge conflicts: the work tree holds git's conflict markers.

``clean``, ``offset`` and ``merged`` patches are committed with the patch's own author, date and message; a
``conflict`` or ``obsolete`` patch leaves the repository with the attempt in its work tree for a person to finish.
The scratch repository is :mod:`overlay.upstream.workspace`; what each patch came to, :mod:`overlay.upstream.outcome`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from overlay.core.patching import MemoryTree, apply_patch
from overlay.core.series import Patch, parse_patch_bytes
from overlay.errors import ConflictError, ExternalCommandError, PatchError
from overlay.git import ops as gitops
from overlay.progress import NullReporter, Reporter
from overlay.stack.checkout import commit_as_patch, commit_patch
from overlay.upstream.astmap import HunkMove, hunk_moves
from overlay.upstream.outcome import Outcome
from overlay.upstream.relocate import relocate_patch, reverse_patch
from overlay.upstream.workspace import (
    Workspace,
    clear_pick_state,
    commit_patch_bytes,
    discard_attempt,
    read_blobs,
    same_diff,
)


def _touched_tree(repo: Path, rev: str, patch: Patch) -> MemoryTree:
    paths = list(patch.paths)
    blobs = read_blobs(repo, [f"{rev}:{p}" for p in paths])
    return MemoryTree({p: b for p, b in zip(paths, blobs) if b is not None})


def _try(tree_files: MemoryTree, patch: Patch) -> bool:
    try:
        apply_patch(MemoryTree(dict(tree_files.files)), patch)
    except PatchError:
        return False
    return True


def classify(ws: Workspace, index: int, patch: Patch, *, reporter: Reporter | None = None) -> Outcome:
    """Classify patch ``index`` (0-based) on the current HEAD; commit it when it resolves by itself."""
    reporter = reporter or NullReporter()
    repo = ws.repo
    old_commit = ws.old_commits[index]
    base = Outcome(name=patch.name, subject=patch.subject, cls="clean", detail="", old_commit=old_commit)
    tree = _touched_tree(repo, "HEAD", patch)
    missing = [
        fd.old_path
        for fd in patch.files
        if fd.kind in ("modify", "rename", "copy") and fd.old_path and tree.read(fd.old_path) is None
    ]
    if missing:
        renames = tuple((p, *ws.renames[p]) for p in missing if p in ws.renames)
        gone = tuple(p for p in missing if p not in ws.renames)
        words = [f"{a} was renamed to {b} upstream (similarity {s}%)" for a, b, s in renames]
        words += [f"{p} no longer exists in {ws.new_version} (no rename detected)" for p in gone]
        conflicts: tuple[str, ...] = ()
        if renames and not gone:
            ok, conflicts = _cherry_pick(repo, old_commit)
            words.append(
                "git carried the change over to the new path (staged); check it"
                if ok
                else f"git's attempt to carry it over conflicts in {', '.join(conflicts)}"
            )
        return dataclasses.replace(
            base,
            cls="obsolete",
            resolution="pending",
            detail="; ".join(words),
            renames=renames,
            gone=gone,
            conflicts=conflicts,
        )
    if _try(tree, patch):
        commit = commit_patch(repo, patch)
        return _finish(
            ws, patch, dataclasses.replace(base, cls="clean", detail="applies exactly", commit=commit)
        )
    try:
        relocated, placements = relocate_patch(tree, patch)
        moved = tuple(p for p in placements if p.offset)
        if moved and _try(tree, relocated):
            commit = commit_patch(repo, relocated)
            detail = (
                "applies exactly at other lines: "
                + ", ".join(f"{p.path} hunk #{p.index} {p.offset:+d}" for p in moved[:4])
                + (" ..." if len(moved) > 4 else "")
            )
            return _finish(
                ws,
                patch,
                dataclasses.replace(base, cls="offset", detail=detail, commit=commit, offsets=moved),
            )
    except PatchError:
        pass
    try:
        rev, _pl = relocate_patch(tree, reverse_patch(patch))
        if _try(tree, rev):
            return dataclasses.replace(
                base,
                cls="upstreamed",
                detail=f"reverse-applies on {ws.new_version}: upstream contains the change",
            )
    except PatchError:
        pass
    ok, conflicts = _cherry_pick(repo, old_commit)
    if not ok:
        return dataclasses.replace(
            base,
            cls="conflict",
            resolution="pending",
            conflicts=conflicts,
            detail="3-way merge conflicts in " + ", ".join(conflicts),
        )
    staged = gitops.z_paths(["diff", "--cached", "--name-only", "-z"], cwd=repo)
    if not staged:
        clear_pick_state(repo)
        return dataclasses.replace(
            base,
            cls="upstreamed",
            detail=f"3-way merge leaves no change on {ws.new_version}: upstream made an equivalent change",
        )
    clear_pick_state(repo)
    commit = commit_as_patch(repo, patch)
    return _finish(
        ws,
        patch,
        dataclasses.replace(
            base,
            cls="merged",
            commit=commit,
            detail=f"3-way merge resolved it ({len(staged)} file{'s' * (len(staged) != 1)})",
        ),
    )


def replay_all(
    ws: Workspace,
    patches: tuple[Patch, ...],
    *,
    stop: bool,
    take_own: bool = False,
    reporter: Reporter | None = None,
) -> list[Outcome]:
    """Classify every patch in order. With ``stop`` False a stopped patch is discarded and the replay goes on; with
    ``take_own`` a conflicting patch is instead resolved with its own side of every conflict (``git cherry-pick -X
    theirs``) and committed, as a person's resolution would be, so the later patches meet it."""
    reporter = reporter or NullReporter()
    outcomes: list[Outcome] = []
    for i, patch in enumerate(patches):
        out = classify(ws, i, patch, reporter=reporter)
        reporter.step("rebase", f"[{i + 1}/{len(patches)}] {patch.name}: {out.cls}")
        outcomes.append(out)
        if not out.resolved:
            if stop:
                break
            discard_attempt(ws.repo)
            if take_own and out.cls == "conflict":
                _take_own_side(ws.repo, out.old_commit, patch)
    return outcomes


def _take_own_side(repo: Path, commit: str, patch: Patch) -> None:
    proc = gitops.run(["cherry-pick", "--no-commit", "-X", "theirs", commit], cwd=repo, check=False)
    unmerged = gitops.z_paths(["diff", "--name-only", "-z", "--diff-filter=U"], cwd=repo)
    staged = gitops.z_paths(["diff", "--cached", "--name-only", "-z"], cwd=repo)
    if proc.returncode != 0 or unmerged or not staged:
        discard_attempt(repo)
        return
    clear_pick_state(repo)
    commit_as_patch(repo, patch)


def estimate_conflicts(
    ws: Workspace, patches: tuple[Patch, ...], outcomes: list[Outcome], *, reporter: Reporter | None = None
) -> list[Outcome]:
    """A dry run's conflicts told apart: replay the series again from the new tree with each conflicting patch
    resolved by its own side, and call a conflict ``own`` when it conflicts there too, ``inherited`` (from the
    earlier conflicting patches that touch its files) when it does not."""
    if not any(o.cls == "conflict" for o in outcomes):
        return outcomes
    discard_attempt(ws.repo)
    gitops.run(["reset", "-q", "--hard", ws.new_base], cwd=ws.repo)
    again = replay_all(ws, patches, stop=False, take_own=True, reporter=reporter)
    out: list[Outcome] = []
    own: list[tuple[str, frozenset[str]]] = []
    for o, r, patch in zip(outcomes, again, patches):
        paths = frozenset(patch.paths)
        if o.cls == "conflict" and r.cls == "conflict":
            out.append(dataclasses.replace(o, conflict_kind="own"))
            own.append((o.name, paths))
        elif o.cls == "conflict":
            sources = tuple(n for n, ps in own if ps & paths) or tuple(n for n, _ps in own)
            out.append(
                dataclasses.replace(
                    o,
                    conflict_kind="inherited",
                    inherited_from=sources,
                    detail=o.detail + f"; inherited: {r.cls} once {', '.join(n[:4] for n in sources)} "
                    f"{'is' if len(sources) == 1 else 'are'} resolved",
                )
            )
        else:
            out.append(o)
            if r.cls == "conflict":
                own.append((o.name, paths))
    return out


def _cherry_pick(repo: Path, commit: str) -> tuple[bool, tuple[str, ...]]:
    proc = gitops.run(["cherry-pick", "--no-commit", commit], cwd=repo, check=False)
    unmerged = tuple(sorted(set(gitops.z_paths(["diff", "--name-only", "-z", "--diff-filter=U"], cwd=repo))))
    if proc.returncode == 0 and not unmerged:
        return True, ()
    if not unmerged:
        raise ExternalCommandError(
            f"`git cherry-pick {commit[:12]}` failed in {repo}: {proc.stderr.decode('utf-8', 'replace').strip()[-1500:]}"
        )
    return False, unmerged


def _finish(ws: Workspace, patch: Patch, outcome: Outcome) -> Outcome:
    """Fill in what only the committed result tells: identical diff (keep the file), hunks that changed symbol."""
    assert outcome.commit is not None
    repo = ws.repo
    if same_diff(repo, outcome.old_commit, outcome.commit):
        return dataclasses.replace(outcome, kept_bytes=True)
    new_patch = parse_patch_bytes(commit_patch_bytes(repo, outcome.commit), name=patch.name)
    moves = location_check(
        repo,
        patch,
        outcome.old_commit,
        new_patch,
        outcome.commit,
        renames={a: b for a, (b, _s) in ws.renames.items()},
    )
    return dataclasses.replace(outcome, moved=tuple(moves))


def location_check(
    repo: Path,
    old_patch: Patch,
    old_commit: str,
    new_patch: Patch,
    new_commit: str,
    *,
    renames: dict[str, str],
) -> list[HunkMove]:
    """The hunk-location check on two commits of one repository (pre-images read at each commit's parent)."""
    old_paths = [fd.old_path for fd in old_patch.files if fd.old_path]
    new_paths = [fd.old_path for fd in new_patch.files if fd.old_path]
    blobs = read_blobs(
        repo, [f"{old_commit}^:{p}" for p in old_paths] + [f"{new_commit}^:{p}" for p in new_paths]
    )
    old_pre = dict(zip(old_paths, blobs[: len(old_paths)]))
    new_pre = dict(zip(new_paths, blobs[len(old_paths) :]))
    return hunk_moves(old_patch, old_pre.get, new_patch, new_pre.get, renames=renames)


CONFLICT_MARKERS = (b"<<<<<<< ", b">>>>>>> ", b"||||||| ")


def resolve_stopped(
    ws: Workspace, patch: Patch, stopped: Outcome, recorded_head: str, *, skip: bool, engine: str = "ENGINE"
) -> Outcome:
    """Take the user's resolution of a stopped patch (``--continue``), or drop it (``--skip``).

    Everything in the work tree counts as the resolution (it is staged with ``git add -A``; a conflicted file needs no
    ``git add`` once its conflict markers are gone). An empty result drops
    the patch. A commit the user made on top of the stop point is taken too (re-committed with the patch's author,
    date and message).
    """
    repo = ws.repo
    if skip:
        gitops.run(["reset", "-q", "--hard", recorded_head], cwd=repo)
        gitops.run(["clean", "-q", "-f", "-d"], cwd=repo)
        clear_pick_state(repo)
        return dataclasses.replace(stopped, resolution="skipped", commit=None)
    head = ws.head()
    if head != recorded_head:
        made = gitops.out(["rev-list", f"{recorded_head}..HEAD"], cwd=repo).split()
        parents = gitops.out(["rev-list", "--parents", "-n", "1", "HEAD"], cwd=repo).split()[1:]
        if len(made) != 1 or parents != [recorded_head]:
            raise ConflictError(
                f"{repo}: HEAD moved from the stop point {recorded_head[:12]} by {len(made)} commits; --continue takes "
                "the work tree (or one commit on top of the stop point) as the resolution",
                tip=f"squash your commits into one (git reset --soft {recorded_head[:12]}), then --continue",
            )
        gitops.run(["reset", "-q", "--soft", recorded_head], cwd=repo)
    unmerged = sorted(set(gitops.z_paths(["diff", "--name-only", "-z", "--diff-filter=U"], cwd=repo)))
    marked = [m for m in (_first_marker(repo, p) for p in unmerged) if m]
    if marked:
        raise ConflictError(
            f"{stopped.name} still has unresolved conflicts: {'; '.join(marked)} (in {repo})",
            tip=f"edit the files until no conflict markers are left, then `overlay rebase {engine} --continue` (or "
            "--skip to drop the patch, --abort to give up)",
        )
    gitops.run(["add", "-A", "--", "."], cwd=repo)
    staged = gitops.z_paths(["diff", "--cached", "--name-only", "-z"], cwd=repo)
    marked = [m for m in (_first_marker(repo, p) for p in staged) if m]
    if marked:
        raise ConflictError(
            f"conflict markers are left in {'; '.join(marked)} (in {repo})",
            tip=f"finish resolving, then `overlay rebase {engine} --continue`",
        )
    if not staged:
        clear_pick_state(repo)
        return dataclasses.replace(stopped, resolution="dropped", commit=None)
    clear_pick_state(repo)
    commit = commit_as_patch(repo, patch)
    done = dataclasses.replace(stopped, resolution="user", commit=commit)
    return _finish(ws, patch, done)


def _first_marker(repo: Path, path: str) -> str:
    """``path:line`` of the first conflict marker left in a work-tree file ('' when there is none)."""
    target = repo / path
    if not target.is_file():
        return ""
    for lineno, line in enumerate(target.read_bytes().splitlines(), start=1):
        if line.startswith(CONFLICT_MARKERS):
            return f"{path}:{lineno}"
    return ""
