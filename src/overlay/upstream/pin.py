"""`overlay pin ENGINE --commit SHA [--git URL]`: record the git commit a pinned release was built from.

The commit is fetched into the engine's git mirror (``build/cache/git/``, the one ``apply --source git`` uses) and its
tree at the manifest's ``package-root`` is compared with the pinned wheel's files at repository paths (what
``checkout`` lays out):

- every Python file (``.py``) the wheel ships must be in the commit with the same bytes, and a ``.py`` file the commit
  has in a package folder the wheel ships must be in the wheel too; any difference is an :class:`IntegrityError` (exit 5) that
  names every such file, and nothing is written;
- other files (compiled libraries, data) that differ or that the commit does not have are listed as information: a
  release's build adds and rewrites such files.

When the Python files match, ``upstream.commit`` (and ``upstream.git`` when given) are set in the manifest, edited in
place with its comments kept (:mod:`overlay.core.pin_edit`), and the ``# base:`` line of ``series`` names the commit
(:func:`overlay.core.series.render_series`, the series writer refresh and rebase use). Both files are written atomically,
under the engine's lock (the one checkout, refresh and rebase hold); ``dry_run`` computes the same and writes nothing.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from overlay.core.fetch import fetch_artifact
from overlay.core.inputs import read_inside
from overlay.core.manifest import Manifest, load_engine, load_manifest
from overlay.core.pin_edit import Edit, apply_edits
from overlay.core.series import parse_series_file, render_series
from overlay.core.sources import git_mirror_path
from overlay.errors import ConfigError, IntegrityError, UsageError
from overlay.fsutil import atomic_write_text
from overlay.git import ops as gitops
from overlay.git.objects import blob_id
from overlay.progress import NullReporter, Reporter
from overlay.stack.locks import engine_lock
from overlay.stack.transaction import recover_refresh
from overlay.upstream.releases import wheel_tree

_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Difference:
    """One file where the commit and the wheel disagree: ``differs`` (both have it, other bytes), ``missing`` (the
    wheel has it, the commit does not), ``extra`` (a Python file the commit has in a folder the wheel ships, the wheel
    does not), ``not-a-file`` (the commit has a symlink or a submodule there)."""

    path: str
    kind: str

    def describe(self) -> str:
        return {
            "differs": f"{self.path}: differs",
            "missing": f"{self.path}: in the wheel, not in the commit",
            "extra": f"{self.path}: in the commit, not in the wheel",
            "not-a-file": f"{self.path}: not a regular file in the commit (a symlink or a submodule)",
        }[self.kind]


@dataclass(frozen=True)
class PinResult:
    engine: str
    version: str
    commit: str
    git: str  # the upstream.git the manifest holds afterwards
    artifact: str  # the pinned wheel the commit was compared with
    python_files: int  # Python files compared (all equal)
    other_files: int  # other files of the wheel
    other_differences: tuple[Difference, ...]  # information only
    written: tuple[Path, ...]  # files changed (with dry_run: that would change)
    manifest_text: str
    series_text: str
    dry_run: bool


def pin_commit(
    *,
    root: Path,
    engine: str,
    commit: str,
    git: str | None = None,
    dry_run: bool = False,
    wait: float = 0.0,
    reporter: Reporter | None = None,
) -> PinResult:
    """Check ``commit`` against the pinned wheel and record it (see the module docstring). A dry run takes no lock."""
    load_engine(root, engine)
    if dry_run:
        return _pin(root=root, engine=engine, commit=commit, git=git, dry_run=True, reporter=reporter)
    with engine_lock(
        root, engine, command=f"overlay pin {engine} --commit {commit}", wait=wait, reporter=reporter
    ):
        recover_refresh(root, engine, reporter=reporter)
        return _pin(root=root, engine=engine, commit=commit, git=git, dry_run=False, reporter=reporter)


def _pin(
    *, root: Path, engine: str, commit: str, git: str | None, dry_run: bool, reporter: Reporter | None
) -> PinResult:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    commit = commit.strip().lower()
    if not _SHA.fullmatch(commit):
        raise UsageError(
            f"--commit {commit!r} is not a full 40-hex git commit id",
            tip="give the full id (`git rev-parse TAG^{commit}` in a clone of upstream)",
        )
    _refuse_rebase_in_progress(root, engine)
    artifact = manifest.upstream.primary
    if not artifact.is_wheel:
        raise UsageError(
            f"{engine}: pin compares the commit with a wheel, {artifact.filename} is an sdist",
            tip="pin a wheel of the release in [[upstream.artifacts]]",
        )
    series_path = manifest.series_dir(root) / "series"
    old_series = _series_text(root, series_path)
    sf = parse_series_file(series_path, root=root)
    if sf.engine != engine or sf.base_version != manifest.upstream.version:
        raise ConfigError(
            f"{series_path} is based on {sf.engine} {sf.base_version}, but {manifest.path.name} pins "
            f"{engine} {manifest.upstream.version}",
            tip="rebase the series (`overlay rebase`) or fix the `# base:` line first",
        )
    url = gitops.check_url(
        git if git is not None else manifest.upstream.git,
        what="--git" if git is not None else f"{manifest.path.name}: upstream.git",
    )
    source = _source(url)
    mirror = git_mirror_path(root, source)
    reporter.step("git", f"fetching {commit[:12]} from {source}")
    gitops.clone_or_update_mirror(source, mirror, commit)
    wheel = fetch_artifact(root, manifest, artifact, reporter=reporter)
    files = wheel_tree(wheel, manifest.upstream.package_root, allow_members=manifest.upstream.allow_members)
    tree = commit_tree(mirror, commit, manifest.upstream.package_root)
    python, other = compare_trees(files, tree, package_root=manifest.upstream.package_root)
    where = f"{source}@{commit[:12]}"
    if python:
        listing = "\n".join("  " + d.describe() for d in python)
        raise IntegrityError(
            f"{where} is not the tree of {artifact.filename}: {len(python)} Python file(s) under "
            f"package-root {manifest.upstream.package_root or '(the repository root)'!r} differ:\n{listing}",
            tip=f"pin the commit the release was built from (e.g. the tag {manifest.upstream.tag or 'of ' + manifest.upstream.version}), "
            "or check --git and upstream.package-root; nothing was written",
        )
    n_py = sum(1 for p in files if _is_python(p))
    reporter.step(
        "git",
        f"{where}: {n_py} Python files equal {artifact.filename}"
        + (f"; {len(other)} other file(s) differ (information)" if other else ""),
    )
    manifest_text = edited_pin(manifest, commit=commit, git=git)
    series_text = render_series(
        old_series, header=f"# base: {engine} {manifest.upstream.version} {commit}", names=sf.names
    )
    old_manifest = manifest.path.read_text(encoding="utf-8")
    changes = [
        (p, old, new)
        for p, old, new in (
            (series_path, old_series, series_text),
            (manifest.path, old_manifest, manifest_text),
        )
        if old != new
    ]
    if not dry_run:
        _write_all(changes)
    return PinResult(
        engine=engine,
        version=manifest.upstream.version,
        commit=commit,
        git=git if git is not None else manifest.upstream.git,
        artifact=artifact.filename,
        python_files=n_py,
        other_files=len(files) - n_py,
        other_differences=tuple(other),
        written=tuple(p for p, _o, _n in changes),
        manifest_text=manifest_text,
        series_text=series_text,
        dry_run=dry_run,
    )


def _refuse_rebase_in_progress(root: Path, engine: str) -> None:
    from overlay.upstream.rebase import STATE_FILE, state_dir

    if (state_dir(root, engine) / STATE_FILE).is_file():
        raise UsageError(
            f"a rebase of {engine} is in progress ({state_dir(root, engine)}); pin would change its base",
            tip=f"finish it (`overlay rebase {engine} --continue` / --publish) or --abort it, then pin",
        )


def _series_text(root: Path, path: Path) -> str:
    try:
        return read_inside(root, path, what="series file").decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist", tip="create it with `# base: ENGINE VERSION COMMIT` as its first line"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8", tip="save series as UTF-8") from None


def _source(url: str) -> str:
    """What git fetches from: a URL as given, a local path resolved (relative to the current folder)."""
    if "://" in url or url.startswith("git@"):
        return url
    local = Path(url).expanduser()
    if not local.exists():
        raise UsageError(
            f"git source {url!r} is neither a URL nor an existing path",
            tip="pass --git URL (https://..., ssh://...) or the path of a clone",
        )
    return str(local.resolve())


# ------------------------------------------------------------------ the comparison


def _is_python(path: str) -> bool:
    return path.endswith(".py")


@dataclass(frozen=True)
class TreeEntry:
    mode: str
    kind: str  # blob, commit (a submodule), tree
    oid: str


def commit_tree(mirror: Path, commit: str, package_root: str) -> dict[str, TreeEntry]:
    """Every entry of ``commit``'s tree under ``package_root`` ({repository path: entry}), read NUL-separated."""
    prefix = package_root.strip("/")
    args = ["ls-tree", "-r", "-z", "--full-tree", commit]
    if prefix:
        args += ["--", prefix]
    raw = gitops.run(args, cwd=mirror).stdout
    entries: dict[str, TreeEntry] = {}
    for item in raw.split(b"\0"):
        if not item:
            continue
        meta, _, name = item.partition(b"\t")
        mode, kind, oid = meta.decode("ascii", "replace").split(" ")
        entries[name.decode("utf-8", "surrogateescape")] = TreeEntry(mode=mode, kind=kind, oid=oid)
    return entries


def _blob_oid(data: bytes, *, length: int) -> str:
    if length == 64:  # a repository in the sha256 object format
        return hashlib.sha256(b"blob %d\0" % len(data) + data).hexdigest()
    return blob_id(data)


def compare_trees(
    files: dict[str, bytes], tree: dict[str, TreeEntry], *, package_root: str = ""
) -> tuple[list[Difference], list[Difference]]:
    """``(python, other)``: the differences between the wheel's ``files`` and the commit's ``tree`` (repository paths),
    Python files first (every one a failure), then the other files of the wheel that differ or are missing.

    A Python file only the commit has counts when it sits in a package folder the wheel ships files of (not the
    package root itself, which holds ``setup.py`` and the like): the wheel would have it, had it been built there."""
    python: list[Difference] = []
    other: list[Difference] = []
    for path in sorted(files):
        entry = tree.get(path)
        if entry is None:
            kind = "missing"
        elif entry.kind != "blob" or entry.mode == "120000":
            kind = "not-a-file"
        elif entry.oid != _blob_oid(files[path], length=len(entry.oid)):
            kind = "differs"
        else:
            continue
        (python if _is_python(path) else other).append(Difference(path, kind))
    shipped = {str(PurePosixPath(p).parent) for p in files} - {
        str(PurePosixPath(package_root.strip("/") or "."))
    }
    for path in sorted(tree):
        if _is_python(path) and path not in files and str(PurePosixPath(path).parent) in shipped:
            python.append(Difference(path, "extra"))
    return python, other


# ------------------------------------------------------------------ writing


def edited_pin(manifest: Manifest, *, commit: str, git: str | None) -> str:
    """The manifest text with ``upstream.commit`` (and ``upstream.git``) set in place, checked by loading it."""
    edits = [Edit("upstream", "commit", commit)]
    if git is not None:
        edits.append(Edit("upstream", "git", git))
    text = apply_edits(manifest.path.read_text(encoding="utf-8"), edits, where=str(manifest.path))
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / manifest.path.name
        probe.write_text(text, encoding="utf-8")
        loaded = load_manifest(probe)
    if loaded.upstream.commit != commit or (git is not None and loaded.upstream.git != git):
        raise ConfigError(
            f"{manifest.path}: setting upstream.commit in place did not give {commit}; edit it by hand"
        )
    return text


def _write_all(changes: list[tuple[Path, str, str]]) -> None:
    """Write every file atomically; when one fails, put back the ones already written."""
    done: list[tuple[Path, str]] = []
    try:
        for path, old, new in changes:
            atomic_write_text(path, new)
            done.append((path, old))
    except BaseException:
        for path, old in reversed(done):
            atomic_write_text(path, old)
        raise
