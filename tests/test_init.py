"""`overlay init`: a new overlay repository from a release on a package index (a real file:// PEP 503 index built
here, read through pip's configuration), then checkout, commit, refresh, lint and apply there; the `check` extra."""

from __future__ import annotations

import email.message
import hashlib
import io
import json
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from overlay.core.extras import require_extra
from overlay.core.series import THEMES
from overlay.errors import IntegrityError, UsageError
from overlay.upstream.index import IndexFile, order_artifacts, parse_project_page, pip_sources, release_files
from overlay.upstream.init import git_url_from
from support import CORE_PY, TRAILERS, git, make_wheel

FILES = {"demo_pkg/__init__.py": b"from demo_pkg.core import greet\n", "demo_pkg/core.py": CORE_PY.encode()}


def _sdist(path: Path) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"Metadata-Version: 2.1\nName: demo-engine\nVersion: 1.2.0\n"
        info = tarfile.TarInfo("demo_engine-1.2.0/PKG-INFO")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return path


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A PEP 503 index at file://tmp/index/simple holding demo-engine 1.2.0 (a pure wheel, a Windows wheel, an sdist,
    a yanked wheel) and 1.1.0; pip (and so overlay) is pointed at it and at nothing else. Returns filename -> sha256
    of the 1.2.0 files that must be pinned."""
    files = tmp_path / "index" / "files"
    files.mkdir(parents=True)
    made = [
        make_wheel(files / "demo_engine-1.2.0-py3-none-any.whl", FILES),
        make_wheel(files / "demo_engine-1.2.0-cp311-cp311-win_amd64.whl", FILES, tag="cp311-cp311-win_amd64"),
        _sdist(files / "demo_engine-1.2.0.tar.gz"),
    ]
    yanked = make_wheel(files / "demo_engine-1.2.0-py2-none-any.whl", FILES, tag="py2-none-any")
    older = make_wheel(files / "demo_engine-1.1.0-py3-none-any.whl", FILES, version="1.1.0")
    sha = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in [*made, yanked, older]}
    links = [
        f'<a href="../../files/{made[0].name}#sha256={sha[made[0].name]}">{made[0].name}</a>',
        f'<a href="../../files/{made[1].name}#sha256={sha[made[1].name]}">{made[1].name}</a>',
        f'<a href="../../files/{made[2].name}">{made[2].name}</a>',  # no hash on the index: init hashes the file
        f'<a href="../../files/{yanked.name}#sha256={sha[yanked.name]}" data-yanked="">{yanked.name}</a>',
        f'<a href="../../files/{older.name}#sha256={sha[older.name]}">{older.name}</a>',
    ]
    page = tmp_path / "index" / "simple" / "demo-engine" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "index" / "simple").as_uri())
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    return {p.name: sha[p.name] for p in made}


def _init(cli: Any, root: Path, *extra: str) -> Any:
    return cli(
        "init",
        "demo",
        "--distribution",
        "demo-engine",
        "--version",
        "1.2.0",
        "--root",
        str(root),
        "--git",
        "https://github.com/example/demo-engine",
        *extra,
    )


def test_init_pins_every_file_of_the_release_and_writes_a_repository(
    index: dict[str, str], tmp_path: Path, cli: Any
) -> None:
    root = tmp_path / "new"
    r = _init(cli, root)
    assert r.code == 0, r.err
    manifest = tomllib.loads((root / "overlays" / "demo.toml").read_text())
    pinned = {a["filename"]: a["sha256"] for a in manifest["upstream"]["artifacts"]}
    assert (
        pinned == index
    )  # every file of 1.2.0 with its sha256 (the sdist hashed here); not 1.1.0, not yanked
    assert manifest["upstream"]["artifacts"][0]["filename"] == "demo_engine-1.2.0-py3-none-any.whl"  # primary
    assert manifest["engine"] == {"name": "demo", "distribution": "demo-engine", "import-name": "demo_pkg"}
    assert manifest["upstream"]["git"] == "https://github.com/example/demo-engine"
    assert (root / "patches" / "demo" / "series").read_text() == "# base: demo 1.2.0 -\n"
    assert (root / ".gitignore").read_text() == "build/\n"
    assert (root / ".git").is_dir()
    assert "NOTE demo_engine-1.2.0-py2-none-any.whl is yanked" in r.out
    for trailer in (
        "Overlay-Theme:",
        "Overlay-Numerics:",
        "Overlay-Check:",
        "Upstream-Status:",
        "Overlay-Flag:",
    ):
        assert trailer in r.out  # the next steps teach the trailers lint requires
    assert f"overlay --root {root} checkout demo" in r.out

    before = (root / "overlays" / "demo.toml").read_bytes()
    again = _init(cli, root)
    assert again.code == 2 and "already exists" in again.err and "never overwrites" in again.err
    assert (root / "overlays" / "demo.toml").read_bytes() == before


def test_checkout_commit_refresh_lint_apply_work_in_an_initialized_repository(
    index: dict[str, str], tmp_path: Path, cli: Any
) -> None:
    root = tmp_path / "new"
    assert _init(cli, root).code == 0
    assert cli("--root", str(root), "checkout", "demo").code == 0
    wt = root / "build" / "worktrees" / "demo"
    core = wt / "demo_pkg" / "core.py"
    core.write_text(core.read_text().replace('prefix = "hello"', 'prefix = "hi"'))
    git(
        wt,
        "commit",
        "-q",
        "-am",
        "core: shorter greeting\n\nSays hi. Measured nothing: a demo.\n\n" + TRAILERS,
    )
    r = cli("--root", str(root), "refresh", "demo")
    assert r.code == 0, r.err
    names = (root / "patches" / "demo" / "series").read_text().splitlines()
    assert names == ["# base: demo 1.2.0 -", "0001-core-shorter-greeting.patch"]

    # no tests/ here: the Overlay-Check (tests/test_demo.py::test_demo) is a warning naming it, not an error
    lint = cli("--root", str(root), "lint", "demo")
    assert lint.code == 0, lint.err
    assert (
        "WARNING demo: 0001-core-shorter-greeting.patch: Overlay-Check 'tests/test_demo.py::test_demo'"
        in lint.err
    )
    lint_json = cli("--root", str(root), "lint", "demo", "--json")
    assert json.loads(lint_json.out)["engines"][0]["warnings"][0].startswith(
        "0001-core-shorter-greeting.patch"
    )
    applied = cli("--root", str(root), "-q", "apply", "demo")
    assert applied.code == 0, applied.err
    wheel = Path(applied.out.strip().splitlines()[-1])
    assert wheel.name.startswith("demo_engine-1.2.0+ovl.") and ".1.g" in wheel.name and wheel.is_file()

    # once the repository has a tests/ folder, a target it lacks is an error again
    (root / "tests").mkdir()
    lint = cli("--root", str(root), "lint", "demo")
    assert lint.code == 2 and "Overlay-Check names 'tests/test_demo.py', which does not exist" in lint.err


def test_init_keeps_an_existing_gitignore_and_repository(
    index: dict[str, str], tmp_path: Path, cli: Any
) -> None:
    outer = tmp_path / "team"
    outer.mkdir()
    git(outer, "init", "-q")
    (outer / ".gitignore").write_text("*.pyc")  # no newline at the end
    assert _init(cli, outer, "--json").code == 0
    assert (outer / ".gitignore").read_text() == "*.pyc\nbuild/\n"
    sub = outer / "sub"
    r = _init(cli, sub, "--json")
    data = json.loads(r.out)
    assert (
        data["git_initialized"] is False and not (sub / ".git").exists()
    )  # inside the team's repository already
    assert data["written"] == ["overlays/demo.toml", "patches/demo/series", ".gitignore"]
    (outer / "second").mkdir()
    (outer / "second" / ".gitignore").write_text("/build/\n")
    r = _init(cli, outer / "second", "--json")
    assert ".gitignore" not in json.loads(r.out)["written"]


@pytest.mark.parametrize("name", ["../escape", "-x", "Demo", "a/b"])
def test_init_refuses_engine_names_that_are_not_one_plain_lower_case_component(
    name: str, tmp_path: Path, cli: Any
) -> None:
    r = cli("init", "--version", "1.2.0", "--root", str(tmp_path / "r"), "--", name)
    assert r.code == 2 and repr(name) in r.err
    assert not (tmp_path / "r").exists()


def test_init_names_the_versions_when_the_index_lacks_the_release(
    index: dict[str, str], tmp_path: Path, cli: Any
) -> None:
    r = cli(
        "init", "demo", "--distribution", "demo-engine", "--version", "9.9", "--root", str(tmp_path / "r")
    )
    assert (
        r.code == 2
        and "has no files of demo-engine 9.9" in r.err
        and "pip index versions demo-engine" in r.err
    )
    assert not (tmp_path / "r" / "overlays").exists()


def test_init_asks_for_git_when_the_metadata_names_no_repository(
    index: dict[str, str], tmp_path: Path, cli: Any
) -> None:
    r = cli(
        "init", "demo", "--distribution", "demo-engine", "--version", "1.2.0", "--root", str(tmp_path / "r")
    )
    assert r.code == 2 and "names no source repository" in r.err and "--git URL" in r.err
    assert not (tmp_path / "r" / "overlays").exists()


def test_git_url_from_metadata_prefers_the_source_url_on_a_forge() -> None:
    meta = email.message.Message()
    meta["Home-page"] = "https://example.org/docs"
    meta["Project-URL"] = "Documentation, https://github.com/org/docs"
    meta["Project-URL"] = "Homepage, https://github.com/org/home"
    meta["Project-URL"] = "Source Code, https://github.com/org/engine/tree/main/"
    assert git_url_from(meta) == "https://github.com/org/engine"
    bare = email.message.Message()
    bare["Home-page"] = "https://example.org/"
    assert git_url_from(bare) is None


def test_simple_api_pages_json_and_html() -> None:
    sha = "a" * 64
    body = json.dumps(
        {
            "meta": {"api-version": "1.0"},
            "files": [
                {
                    "filename": "x-1.0-py3-none-any.whl",
                    "url": "../../f/x-1.0-py3-none-any.whl",
                    "hashes": {"sha256": sha},
                },
                {
                    "filename": "x-1.0.tar.gz",
                    "url": "https://h/x-1.0.tar.gz",
                    "hashes": {},
                    "yanked": "broken",
                },
            ],
        }
    ).encode()
    got = parse_project_page(
        body, content_type="application/vnd.pypi.simple.v1+json", base_url="https://idx/simple/x/"
    )
    assert got == [
        IndexFile("x-1.0-py3-none-any.whl", "https://idx/f/x-1.0-py3-none-any.whl", sha),
        IndexFile("x-1.0.tar.gz", "https://h/x-1.0.tar.gz", None, yanked=True),
    ]
    html = (
        f'<a href="/p/x_y-1.0-py3-none-any.whl#sha256={sha}" data-requires-python="&gt;=3.8">x</a>'.encode()
    )
    assert parse_project_page(html, content_type="text/html", base_url="https://idx/simple/x/") == [
        IndexFile("x_y-1.0-py3-none-any.whl", "https://idx/p/x_y-1.0-py3-none-any.whl", sha)
    ]


def test_the_same_file_with_two_hashes_on_two_indexes_is_an_integrity_error() -> None:
    a = IndexFile("x-1.0-py3-none-any.whl", "https://one/x.whl", "a" * 64)
    b = IndexFile("x-1.0-py3-none-any.whl", "https://two/x.whl", "b" * 64)
    with pytest.raises(IntegrityError, match="two indexes serve x-1.0-py3-none-any.whl"):
        release_files([a, b], "x", "1.0")
    assert release_files([a, IndexFile(a.filename, "https://two/x.whl", None)], "x", "1.0") == [a]


def test_pip_sources_env_wins_over_download_over_global() -> None:
    listed = (
        "global.index-url='https://g/simple'\ndownload.index-url='https://d/simple'\n"
        "global.extra-index-url='file:///a/simple file:///b/simple'\n:env:.find-links='/w'\n"
    )
    src = pip_sources(listed)
    assert src.index_url == "https://d/simple" and src.extra_index_urls == (
        "file:///a/simple",
        "file:///b/simple",
    )
    assert src.find_links == ("/w",) and src.pages == (
        "https://d/simple",
        "file:///a/simple",
        "file:///b/simple",
    )
    assert pip_sources(listed + ":env:.index-url='https://e/simple'\n:env:.no-index='true'\n").pages == ()
    assert pip_sources("").index_url == "https://pypi.org/simple"


def test_primary_artifact_is_a_wheel_this_interpreter_installs() -> None:
    names = ["x-1.0.tar.gz", "x-1.0-cp311-cp311-win_amd64.whl", "x-1.0-py3-none-any.whl"]
    assert order_artifacts(names) == [
        "x-1.0-py3-none-any.whl",
        "x-1.0-cp311-cp311-win_amd64.whl",
        "x-1.0.tar.gz",
    ]
    assert order_artifacts(["x-1.0.tar.gz"]) == ["x-1.0.tar.gz"]


def test_next_steps_name_real_themes() -> None:
    from overlay.cli import cmd_init

    text = Path(cmd_init.__file__).read_text()
    for theme in ("other", "cuda-graph", "h2d-sync", "sampling-fusion", "loading", "platform"):
        assert theme in THEMES and theme in text


@pytest.mark.parametrize("missing", ["numpy", "safetensors", "tokenizers"])
def test_check_and_models_name_the_extra_when_a_module_is_missing(
    missing: str, monkeypatch: pytest.MonkeyPatch, world: Any, cli: Any
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` now raises ImportError
    with pytest.raises(UsageError, match=rf"needs {missing}, which is not installed") as info:
        require_extra("check", command="check")
    assert info.value.tip is not None and "pip install 'engine-overlay[check]'" in info.value.tip
    for argv in (["check", "demo"], ["models", "list"]):
        r = cli("--root", str(world.root), *argv)
        assert (
            r.code == 2 and f"needs {missing}" in r.err and "TIP pip install 'engine-overlay[check]'" in r.err
        )
