"""The series as a git worktree: `overlay checkout` (one commit per patch) and `overlay refresh` (worktree -> patches).

The worktree's first commit is the pinned upstream tree laid out at git-repository-root paths (the wheel's files
under ``package-root``), committed with a fixed identity and date so its id is reproducible. Each patch becomes one
commit with the patch's author, date and message (trailers included). ``refresh`` writes the series back: a commit
that is still the one checkout made keeps its patch file byte for byte; anything else is exported with
``git format-patch --no-signature --zero-commit --full-index --no-numbered``.
"""

from __future__ import annotations

import email.utils
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlay import gitops
from overlay.build import build_dir, load_engine_series
from overlay.errors import ConfigError, UsageError
from overlay.fetch import fetch_artifact
from overlay.fsutil import atomic_write_bytes, atomic_write_text, owned_scratch
from overlay.manifest import Manifest, load_engine
from overlay.patching import DirTree, apply_patch
from overlay.progress import NullReporter, Reporter
from overlay.series import Patch, parse_patch_bytes
from overlay.wheels import read_wheel

STATE_FILE = "overlay-checkout.json"
FORMAT_PATCH_ARGS = (
    "format-patch",
    "--no-signature",
    "--zero-commit",
    "--full-index",
    "--no-numbered",
    "--no-cover-letter",
    "--no-thread",
    "--no-attach",
    "--subject-prefix=PATCH",
    "--no-binary",
)


@dataclass(frozen=True)
class CheckoutResult:
    worktree: Path
    base: str
    commits: tuple[tuple[str, str], ...]  # (commit, patch name)


@dataclass(frozen=True)
class RefreshResult:
    written: tuple[str, ...]  # patch files whose bytes changed or are new
    kept: tuple[str, ...]  # patch files left byte-identical (possibly renamed)
    removed: tuple[str, ...]
    series_changed: bool


def default_worktree(root: Path, engine: str) -> Path:
    return build_dir(root) / "worktrees" / engine


def _state_path(worktree: Path) -> Path:
    return worktree / ".git" / STATE_FILE


def read_state(worktree: Path) -> dict[str, Any]:
    path = _state_path(worktree)
    if not path.is_file():
        raise UsageError(
            f"{worktree} is not a worktree made by `overlay checkout` (no .git/{STATE_FILE})",
            tip="run `overlay checkout ENGINE` first",
        )
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def base_tree_files(root: Path, manifest: Manifest, *, offline: bool = False, reporter: Reporter | None = None) -> dict[str, bytes]:
    """The pinned wheel's files (dist-info excluded) at git-repository-root paths."""
    artifact = manifest.upstream.primary
    if not artifact.is_wheel:
        raise UsageError(f"{manifest.name}: checkout needs a wheel pin, {artifact.filename} is an sdist")
    contents = read_wheel(fetch_artifact(root, manifest, artifact, offline=offline, reporter=reporter))
    prefix = manifest.upstream.package_root.strip("/")
    files = {}
    for path, data in contents.tree.files.items():
        top = path.split("/", 1)[0]
        if top.endswith((".dist-info", ".data")):
            continue
        files[f"{prefix}/{path}" if prefix else path] = data
    return files


def write_base_commit(repo: Path, files: dict[str, bytes], message: str) -> str:
    for rel, data in files.items():
        target = repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return gitops.commit_all(repo, message, env=gitops.TOOL_IDENTITY)


def commit_patch(repo: Path, patch: Patch) -> str:
    """Apply ``patch`` strictly to the work tree and commit it with the patch's own author, date and message."""
    apply_patch(DirTree(repo), patch)
    gitops.run(["add", "-A", "-f", "."], cwd=repo)
    return commit_as_patch(repo, patch)


def commit_as_patch(repo: Path, patch: Patch) -> str:
    """Commit what is staged with ``patch``'s author, date and message (trailers included); returns the commit."""
    name, addr = email.utils.parseaddr(patch.author)
    env = {
        "GIT_AUTHOR_NAME": name or addr,
        "GIT_AUTHOR_EMAIL": addr,
        "GIT_AUTHOR_DATE": patch.date or gitops.TOOL_IDENTITY["GIT_AUTHOR_DATE"],
        "GIT_COMMITTER_NAME": gitops.TOOL_IDENTITY["GIT_COMMITTER_NAME"],
        "GIT_COMMITTER_EMAIL": gitops.TOOL_IDENTITY["GIT_COMMITTER_EMAIL"],
        "GIT_COMMITTER_DATE": patch.date or gitops.TOOL_IDENTITY["GIT_COMMITTER_DATE"],
    }
    message = patch.subject + ("\n\n" + patch.body if patch.body else "") + "\n"
    msg_file = repo / ".git" / "OVERLAY_MSG"
    msg_file.write_text(message, encoding="utf-8")
    gitops.run(["commit", "-q", "--no-verify", "--allow-empty", "--cleanup=verbatim", "-F", str(msg_file)], cwd=repo, env=env)
    msg_file.unlink()
    return gitops.out(["rev-parse", "HEAD"], cwd=repo)


def checkout(
    *,
    root: Path,
    engine: str,
    worktree: Path | None = None,
    upto: int | None = None,
    force: bool = False,
    offline: bool = False,
    reporter: Reporter | None = None,
) -> CheckoutResult:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    series = load_engine_series(root, manifest)
    if upto is not None and not 0 <= upto <= len(series.patches):
        raise UsageError(f"--upto {upto} is out of range: the series has {len(series.patches)} patches")
    worktree = (worktree or default_worktree(root, engine)).resolve()
    if worktree.exists() and any(worktree.iterdir()):
        if not force:
            dirty = gitops.is_dirty(worktree) if (worktree / ".git").is_dir() else ["(not a git repository)"]
            raise UsageError(
                f"{worktree} already exists" + (f" and has uncommitted changes ({len(dirty)} paths)" if dirty else ""),
                tip=f"keep working there and `overlay refresh {engine}`, or pass --force to recreate it (discards its commits)",
            )
    files = base_tree_files(root, manifest, offline=offline, reporter=reporter)
    patches = series.prefix(upto)
    with owned_scratch(build_dir(root) / "tmp", f"checkout-{engine}") as scratch:
        repo = scratch / "wt"
        gitops.init(repo)
        reporter.step("git", f"base commit: {manifest.name} {manifest.upstream.version} ({len(files)} files)")
        base = write_base_commit(repo, files, base_message(manifest))
        gitops.run(["tag", "overlay/base", base], cwd=repo)
        commits: list[tuple[str, str]] = []
        for i, patch in enumerate(patches, start=1):
            reporter.step("apply", f"[{i}/{len(patches)}] {patch.name}")
            commits.append((commit_patch(repo, patch), patch.name))
        state = {
            "version": 1,
            "engine": engine,
            "upstream": manifest.upstream.version,
            "base": base,
            "upto": upto,
            "patches": [{"commit": c, "name": n, "sha256": p.sha256} for (c, n), p in zip(commits, patches)],
            "rest": [p.name for p in series.patches[len(patches):]],
        }
        atomic_write_text(_state_path(repo), json.dumps(state, indent=2) + "\n")
        if worktree.exists():
            shutil.rmtree(worktree)
        worktree.parent.mkdir(parents=True, exist_ok=True)
        os.replace(repo, worktree)
    reporter.step("git", f"worktree ready: {worktree} ({len(commits)} patch commits on overlay/base)")
    return CheckoutResult(worktree=worktree, base=base, commits=tuple(commits))


def base_message(manifest: Manifest) -> str:
    a = manifest.upstream.primary
    return f"base: {manifest.name} {manifest.upstream.version}\n\n{a.filename}\nsha256 {a.sha256}\n"


def export_patches(repo: Path, base: str, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    gitops.run([*FORMAT_PATCH_ARGS, "-o", str(out), f"{base}..HEAD"], cwd=repo)
    return sorted(out.glob("*.patch"))


def refresh(
    *,
    root: Path,
    engine: str,
    worktree: Path | None = None,
    force: bool = False,
    dry_run: bool = False,
    reporter: Reporter | None = None,
) -> RefreshResult:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    worktree = (worktree or default_worktree(root, engine)).resolve()
    if not (worktree / ".git").is_dir():
        raise UsageError(f"{worktree} is not a git worktree", tip=f"run `overlay checkout {engine}` first")
    state = read_state(worktree)
    if state.get("engine") != engine:
        raise UsageError(f"{worktree} is a checkout of {state.get('engine')!r}, not {engine!r}")
    dirty = gitops.is_dirty(worktree)
    if dirty and not force:
        raise UsageError(
            f"{worktree} has uncommitted changes ({', '.join(dirty[:5])}{' ...' if len(dirty) > 5 else ''})",
            tip="commit or discard them first (refresh exports commits only), or pass --force to ignore them",
        )
    base = state["base"]
    problems = _base_problems(worktree, base, state, manifest)
    if not problems and not force:
        problems = _base_tree_problem(root, worktree, base, manifest)
    if problems and not force:
        raise UsageError(problems, tip="check out the series again at the current pin, or pass --force")
    series_dir = manifest.series_dir(root)
    old_series = load_engine_series(root, manifest, check_folder=False)
    known = {p["commit"]: p["name"] for p in state["patches"]}
    old_bytes = {p.name: p.raw for p in old_series.patches}
    commits = gitops.out(["rev-list", "--reverse", f"{base}..HEAD"], cwd=worktree).split()
    merges = gitops.out(["rev-list", "--merges", f"{base}..HEAD"], cwd=worktree).split()
    if merges:
        raise UsageError(f"{worktree}: merge commits cannot become patches ({merges[0][:12]})", tip="linearise with git rebase")
    with owned_scratch(build_dir(root) / "tmp", f"refresh-{engine}") as scratch:
        exported = export_patches(worktree, base, scratch / "out") if commits else []
        if len(exported) != len(commits):
            raise UsageError(f"git format-patch wrote {len(exported)} files for {len(commits)} commits")
        new_files: list[tuple[str, bytes, bool]] = []  # (name, bytes, kept)
        for idx, (commit, path) in enumerate(zip(commits, exported), start=1):
            data = path.read_bytes()
            slug = path.name[5:]  # strip git's own "NNNN-"
            if commit in known:
                data = old_bytes[known[commit]]
                slug = known[commit][5:]
            name = f"{idx:04d}-{slug}"
            parse_patch_bytes(data, name=name, where=f"commit {commit[:12]}")  # refuse what we could not read back
            new_files.append((name, data, commit in known))
        offset = len(new_files)
        for j, rest_name in enumerate(state.get("rest", []), start=1):
            if rest_name not in old_bytes:
                raise ConfigError(f"{rest_name} (after --upto) is no longer in the series")
            new_files.append((f"{offset + j:04d}-{rest_name[5:]}", old_bytes[rest_name], True))
    written = tuple(n for n, d, _k in new_files if old_bytes.get(n) != d)
    kept = tuple(n for n, d, _k in new_files if old_bytes.get(n) == d or (_k and n not in old_bytes))
    new_names = {n for n, _d, _k in new_files}
    removed = tuple(sorted(set(old_bytes) - new_names))
    series_text = _series_text(series_dir / "series", manifest, [n for n, _d, _k in new_files])
    old_text = (series_dir / "series").read_text(encoding="utf-8")
    if not dry_run:
        for name, data, _k in new_files:
            target = series_dir / name
            if not target.is_file() or target.read_bytes() != data:
                atomic_write_bytes(target, data)
        for name in removed:
            (series_dir / name).unlink()
        if series_text != old_text:
            atomic_write_text(series_dir / "series", series_text)
        # the worktree now matches the series: remember its commits so a second refresh rewrites nothing
        new_state = dict(state)
        new_state["patches"] = [
            {"commit": c, "name": n, "sha256": ""} for c, (n, _d, _k) in zip(commits, new_files)
        ]
        new_state["rest"] = []
        new_state["upto"] = None
        for entry, (_n, d, _k) in zip(new_state["patches"], new_files):
            import hashlib

            entry["sha256"] = hashlib.sha256(d).hexdigest()
        if state.get("rest"):
            new_state["rest"] = [n for n, _d, _k in new_files[len(commits):]]
            new_state["patches"] = new_state["patches"][: len(commits)]
        atomic_write_text(_state_path(worktree), json.dumps(new_state, indent=2) + "\n")
    reporter.step("git", f"refresh: {len(written)} written, {len(removed)} removed, series {'changed' if series_text != old_text else 'unchanged'}")
    return RefreshResult(written=written, kept=kept, removed=removed, series_changed=series_text != old_text)


def _base_problems(worktree: Path, base: str, state: dict[str, Any], manifest: Manifest) -> str:
    if state.get("upstream") != manifest.upstream.version:
        return (f"{worktree} was checked out at {manifest.name} {state.get('upstream')}, but the manifest now pins "
                f"{manifest.upstream.version}")
    if gitops.rev_parse(worktree, base) is None:
        return f"{worktree}: the base commit {base[:12]} is gone"
    roots = gitops.out(["rev-list", "--max-parents=0", "HEAD"], cwd=worktree).split()
    if roots != [base]:
        return f"{worktree}: HEAD does not descend from the pinned base commit {base[:12]} alone (roots: {[r[:12] for r in roots]})"
    return ""


def _base_tree_problem(root: Path, worktree: Path, base: str, manifest: Manifest) -> str:
    """The base commit must hold exactly the pinned artifact's tree (the pin may have changed at the same version)."""
    from overlay.gitobjects import tree_id

    expected = tree_id(base_tree_files(root, manifest))
    found = gitops.out(["rev-parse", f"{base}^{{tree}}"], cwd=worktree)
    if found != expected:
        return (f"{worktree}: the base commit {base[:12]} does not hold the pinned artifact's tree "
                f"({manifest.upstream.primary.filename}, sha256 {manifest.upstream.primary.sha256[:16]}...): "
                f"tree {found[:12]}, expected {expected[:12]}")
    return ""


def _series_text(path: Path, manifest: Manifest, names: list[str]) -> str:
    """Rewrite the series file's entries, keeping its header and comment lines where they were."""
    old = path.read_text(encoding="utf-8").splitlines()
    header = old[0] if old else f"# base: {manifest.name} {manifest.upstream.version} {manifest.upstream.commit or '-'}"
    comments = [line for line in old[1:] if line.strip().startswith("#") or not line.strip()]
    lines = [header, *[c for c in comments if c.strip()], *names]
    return "\n".join(lines) + "\n"
