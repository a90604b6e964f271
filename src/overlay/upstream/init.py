"""`overlay init ENGINE --version V`: a new overlay repository for a release on the package index.

Every file of the release (each wheel, for every Python tag and platform, and the sdist) is listed with its sha256
from the index's simple API (PEP 691 JSON, or PEP 503 HTML with ``#sha256=`` fragments), through the indexes pip is
configured with (``pip config list``: ``index-url``, ``extra-index-url``, ``find-links``, ``no-index``; the
``PIP_*`` variables included), so a proxy or a file:// mirror applies as it does for ``overlay fetch``. The primary
artifact (the one ``apply`` builds from) is then downloaded through pip like ``fetch`` does, its hash checked
against the index's, and its metadata read for the import name and the upstream git repository. Only then is
anything written: ``overlays/ENGINE.toml``, ``patches/ENGINE/series`` with its base line, ``build/`` in
``.gitignore``, and ``git init`` when the folder is not inside a git repository.
"""

from __future__ import annotations

import email.message
import email.parser
import json
import re
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import Artifact, Manifest, SeriesSpec, Upstream, check_engine_name, load_manifest
from overlay.core.series import parse_series_file
from overlay.errors import UsageError
from overlay.fsutil import atomic_write_text
from overlay.git import ops as gitops
from overlay.progress import NullReporter, Reporter
from overlay.upstream.index import (
    PipSources,
    configured_sources,
    hash_url,
    index_files,
    order_artifacts,
    release_files,
)

_ENGINE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # the rule load_manifest enforces on engine.name
_FORGES = ("github.com", "gitlab.com", "codeberg.org", "bitbucket.org")
_SOURCE_LABELS = ("source", "sourcecode", "repository", "code", "github", "homepage")


@dataclass(frozen=True)
class InitResult:
    root: Path
    engine: str
    distribution: str
    version: str
    import_name: str
    git: str
    artifacts: tuple[Artifact, ...]  # the primary one first
    written: tuple[Path, ...]
    git_initialized: bool
    skipped_yanked: tuple[str, ...]


def _metadata(path: Path) -> tuple[email.message.Message, list[str]]:
    """(core metadata, top-level importable names) of a wheel or sdist, read without extracting it."""
    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            meta = next((n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
            top = next(
                (n for n in names if n.count("/") == 1 and n.endswith(".dist-info/top_level.txt")), None
            )
            text = zf.read(meta).decode("utf-8", "replace") if meta else ""
            tops = (
                zf.read(top).decode("utf-8", "replace").split()
                if top
                else sorted(
                    {
                        n.split("/")[0].removesuffix(".py")
                        for n in names
                        if (n.endswith("/__init__.py") and n.count("/") == 1)
                        or (n.count("/") == 0 and n.endswith(".py"))
                    }
                )
            )
        return email.parser.Parser().parsestr(text, headersonly=True), tops
    text = ""
    if path.name.endswith(".tar.gz"):
        with tarfile.open(path) as tf:
            info = next(
                (m for m in tf.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")), None
            )
            fh = tf.extractfile(info) if info is not None and info.isfile() else None
            text = fh.read().decode("utf-8", "replace") if fh else ""
    return email.parser.Parser().parsestr(text, headersonly=True), []


def git_url_from(meta: email.message.Message) -> str | None:
    """The upstream repository a release's metadata names: a Project-URL labelled source/repository/code/homepage
    (in that order) on a known forge, else a Home-page there; trimmed to https://HOST/OWNER/REPO."""
    candidates: list[tuple[int, str]] = []
    for value in meta.get_all("Project-URL") or []:
        label, _, url = value.partition(",")
        norm = re.sub(r"[^a-z]", "", label.lower())
        if norm in _SOURCE_LABELS:
            candidates.append((_SOURCE_LABELS.index(norm), url.strip()))
    if meta.get("Home-page"):
        candidates.append((len(_SOURCE_LABELS), str(meta["Home-page"]).strip()))
    for _rank, url in sorted(candidates, key=lambda c: c[0]):
        parsed = urllib.parse.urlsplit(url)
        parts = [p for p in parsed.path.split("/") if p]
        if parsed.scheme in ("http", "https") and parsed.netloc.lower() in _FORGES and len(parts) >= 2:
            return f"https://{parsed.netloc.lower()}/{parts[0]}/{parts[1].removesuffix('.git')}"
    return None


def _toml(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string


def manifest_text(
    *,
    engine: str,
    distribution: str,
    import_name: str,
    version: str,
    git: str,
    package_root: str,
    artifacts: tuple[Artifact, ...],
) -> str:
    lines = [
        f"# {distribution} {version}, pinned by `overlay init` from the package index: every file of the release.",
        "# The first wheel is the one `overlay apply` builds from (`--artifact FILE` names another).",
        "[engine]",
        f"name = {_toml(engine)}",
        f"distribution = {_toml(distribution)}",
        f"import-name = {_toml(import_name)}",
        "",
        "[upstream]",
        f"version = {_toml(version)}",
        f"git = {_toml(git)}",
        "# commit: not established; `overlay pin " + engine + " --commit SHA` checks one and records it.",
        f"package-root = {_toml(package_root)}",
    ]
    for a in artifacts:
        lines += [
            "",
            "[[upstream.artifacts]]",
            f"filename = {_toml(a.filename)}",
            f"sha256 = {_toml(a.sha256)}",
        ]
    lines += ["", "[series]", f"dir = {_toml('patches/' + engine)}", 'label = "ovl"']
    return "\n".join(lines) + "\n"


def _in_git_repository(root: Path) -> bool:
    proc = gitops.run(["rev-parse", "--is-inside-work-tree"], cwd=root, check=False)
    return proc.returncode == 0 and proc.stdout.strip() == b"true"


def init_repository(
    *,
    root: Path,
    engine: str,
    version: str,
    distribution: str | None = None,
    git: str | None = None,
    import_name: str | None = None,
    package_root: str = "",
    sources: PipSources | None = None,
    reporter: Reporter | None = None,
) -> InitResult:
    """Create (or add ``engine`` to) the overlay repository at ``root``; see the module docstring."""
    from overlay.upstream.releases import check_version

    reporter = reporter or NullReporter()
    check_engine_name(engine)
    if not _ENGINE.match(engine):
        raise UsageError(
            f"engine name {engine!r} must be lower-case letters, digits, '.', '_' or '-'",
            tip=f"e.g. {engine.lower()!r}",
        )
    version = check_version(version)
    distribution = distribution or engine
    manifest_path = root / "overlays" / f"{engine}.toml"
    series_path = root / "patches" / engine / "series"
    for existing in (manifest_path, series_path):
        if existing.exists() or existing.is_symlink():
            raise UsageError(
                f"{existing} already exists; init never overwrites a manifest or a series",
                tip=f"edit it, or remove it first to start {engine} over",
            )
    if root.exists() and not root.is_dir():
        raise UsageError(f"--root {root} is not a folder")
    sources = sources or configured_sources()
    root.mkdir(parents=True, exist_ok=True)
    reporter.step(
        "fetch",
        f"{distribution} {version}: listing the release's files ({', '.join(sources.pages) or 'no index'})",
    )
    files = release_files(index_files(sources, distribution), distribution, version)
    yanked = tuple(sorted(f.filename for f in files if f.yanked))
    files = [f for f in files if not f.yanked]
    if not files:
        raise UsageError(
            f"the package index has no files of {distribution} {version}"
            + (f" (yanked: {', '.join(yanked)})" if yanked else ""),
            tip=f"check the name and version (`pip index versions {distribution}`); --distribution NAME when it "
            "differs from the engine name",
        )
    by_name = {f.filename: f for f in files}
    artifacts = tuple(
        Artifact(filename=n, sha256=by_name[n].sha256 or hash_url(by_name[n].url))
        for n in order_artifacts(list(by_name))
    )
    reporter.step("fetch", f"{len(artifacts)} files; primary {artifacts[0].filename}")
    draft = Manifest(
        path=manifest_path,
        name=engine,
        distribution=distribution,
        import_name=import_name or "-",
        upstream=Upstream(
            version=version,
            git=git or "-",
            tag=None,
            commit=None,
            package_root=package_root.strip("/"),
            artifacts=artifacts,
        ),
        series=SeriesSpec(dir=f"patches/{engine}", label="ovl"),
    )
    primary = fetch_artifact(root, draft, artifacts[0], reporter=reporter)  # through pip, hash checked
    meta, tops = _metadata(primary)
    if import_name is None:
        guess = canonicalize_name(distribution).replace("-", "_")
        import_name = guess if guess in tops or not tops else tops[0]
    if git is None:
        git = git_url_from(meta)
        if git is None:
            raise UsageError(
                f"{artifacts[0].filename}'s metadata names no source repository on a known forge "
                f"({', '.join(_FORGES)})",
                tip="pass --git URL (the upstream repository)",
            )
    gitops.check_url(git, what="--git")
    text = manifest_text(
        engine=engine,
        distribution=distribution,
        import_name=import_name,
        version=version,
        git=git,
        package_root=package_root.strip("/"),
        artifacts=artifacts,
    )
    written: list[Path] = []
    initialized = not _in_git_repository(root)
    if initialized:
        gitops.init(root)
    atomic_write_text(manifest_path, text)
    written.append(manifest_path)
    atomic_write_text(series_path, f"# base: {engine} {version} -\n")
    written.append(series_path)
    gitignore = root / ".gitignore"
    old = gitignore.read_text(encoding="utf-8") if gitignore.is_file() else ""
    if not {"build", "build/", "/build", "/build/"} & {line.strip() for line in old.splitlines()}:
        atomic_write_text(gitignore, old + ("" if not old or old.endswith("\n") else "\n") + "build/\n")
        written.append(gitignore)
    load_manifest(manifest_path, root=root)  # what we wrote reads back as a valid manifest and series
    parse_series_file(series_path, root=root)
    return InitResult(
        root=root,
        engine=engine,
        distribution=distribution,
        version=version,
        import_name=import_name,
        git=git,
        artifacts=artifacts,
        written=tuple(written),
        git_initialized=initialized,
        skipped_yanked=yanked,
    )


def describe(result: InitResult) -> dict[str, Any]:
    """The JSON form (``--json``)."""
    return {
        "version": 1,
        "engine": result.engine,
        "distribution": result.distribution,
        "upstream": result.version,
        "import_name": result.import_name,
        "git": result.git,
        "root": str(result.root),
        "artifacts": [{"filename": a.filename, "sha256": a.sha256} for a in result.artifacts],
        "written": [str(p.relative_to(result.root)) for p in result.written],
        "git_initialized": result.git_initialized,
        "skipped_yanked": list(result.skipped_yanked),
    }
