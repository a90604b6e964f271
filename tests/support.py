"""Build throwaway worlds for tests: a synthetic upstream git repository, a release wheel made from it, an overlay
repository pinning that wheel, and patches made with real git."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import textwrap
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from overlay.stack.checkout import FORMAT_PATCH_ARGS

if TYPE_CHECKING:
    from overlay.check.adapter import EngineAdapter

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_COMMITTER_NAME": "Test Author",
    "GIT_COMMITTER_EMAIL": "author@example.com",
    "GIT_AUTHOR_DATE": "2026-01-02T03:04:05Z",
    "GIT_COMMITTER_DATE": "2026-01-02T03:04:05Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}

TRAILERS = """\
Overlay-Theme: other
Overlay-Numerics: exact
Overlay-Check: tests/test_demo.py::test_demo
Upstream-Status: Pending
Overlay-Flag: default
"""

CORE_PY = textwrap.dedent(
    '''\
    """A tiny engine."""

    __version__ = "1.2.0"


    def greet(name):
        prefix = "hello"
        return f"{prefix}, {name}"


    def add(a, b):
        return a + b


    class Engine:
        def __init__(self, size):
            self.size = size

        def step(self, x):
            y = x * 2
            return y + self.size
    '''
)


def git(repo: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, input=input
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {args} failed: {proc.stderr.decode()}")
    return proc.stdout.decode().strip()


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    path: Path,
    files: dict[str, bytes],
    *,
    dist: str = "demo_engine",
    version: str = "1.2.0",
    tag: str = "py3-none-any",
    executable: frozenset[str] = frozenset(),
    extra_members: list[tuple[zipfile.ZipInfo, bytes]] | None = None,
) -> Path:
    """A plain, valid wheel (what an upstream release would be), written like a typical build backend does."""
    dist_info = f"{dist}-{version}.dist-info"
    meta = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n"
        f"Requires-Python: >=3.8\n\nA demo engine.\n".encode(),
        f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode(),
        f"{dist_info}/top_level.txt": b"demo_pkg\n",
    }
    allfiles = {**files, **meta}
    record = (
        "".join(f"{p},{record_hash(d)},{len(d)}\n" for p, d in allfiles.items()) + f"{dist_info}/RECORD,,\n"
    )
    allfiles[f"{dist_info}/RECORD"] = record.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in allfiles.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 2, 3, 4, 5))
            mode = 0o755 if name in executable else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        for info, data in extra_members or []:
            zf.writestr(info, data)
    return path


@dataclass
class World:
    root: Path  # the overlay repository
    upstream: Path  # the upstream git repository
    wheel: Path  # the pinned release wheel
    base_commit: str
    package_root: str

    @property
    def series_dir(self) -> Path:
        return self.root / "patches" / "demo"

    def manifest_text(self, **over: str) -> str:
        sha = hashlib.sha256(self.wheel.read_bytes()).hexdigest()
        fields = {
            "sha256": sha,
            "url": self.wheel.as_uri(),
            "filename": self.wheel.name,
            "commit": self.base_commit,
            "package_root": self.package_root,
            "version": "1.2.0",
        }
        fields.update(over)
        return textwrap.dedent(
            f"""\
            [engine]
            name = "demo"
            distribution = "demo-engine"
            import-name = "demo_pkg"

            [upstream]
            version = "{fields["version"]}"
            git = "{self.upstream}"
            tag = "v1.2.0"
            commit = "{fields["commit"]}"
            package-root = "{fields["package_root"]}"

            [[upstream.artifacts]]
            filename = "{fields["filename"]}"
            sha256 = "{fields["sha256"]}"
            url = "{fields["url"]}"

            [series]
            dir = "patches/demo"
            label = "ovl"
            """
        )

    def write_manifest(self, **over: str) -> None:
        (self.root / "overlays" / "demo.toml").write_text(self.manifest_text(**over))

    def commit_change(
        self, rel: str, old: str, new: str, subject: str, *, trailers: str = TRAILERS, body: str = ""
    ) -> str:
        """Edit a file of the upstream repository on branch `work` and commit it with a message + trailers."""
        path = self.upstream / rel
        text = path.read_text()
        assert old in text, f"{old!r} not in {rel}"
        path.write_text(text.replace(old, new, 1))
        git(self.upstream, "add", "-A")
        message = subject + "\n\n" + (body or f"Changes {rel}: {subject}.") + "\n\n" + trailers
        git(self.upstream, "commit", "-q", "-m", message)
        return git(self.upstream, "rev-parse", "HEAD")

    def export_series(self) -> list[str]:
        """Write base..work as format-patch files into patches/demo and list them in series."""
        out = self.series_dir
        for old in out.glob("*.patch"):
            old.unlink()
        git(self.upstream, *FORMAT_PATCH_ARGS, "-o", str(out), f"{self.base_commit}..HEAD")
        names = sorted(p.name for p in out.glob("*.patch"))
        (out / "series").write_text(
            f"# base: demo 1.2.0 {self.base_commit}\n" + "".join(n + "\n" for n in names)
        )
        return names


def make_world(tmp_path: Path, *, package_root: str = "python") -> World:
    """A synthetic upstream: git repo with `python/demo_pkg/...` + a setuptools project, and its release wheel."""
    upstream = tmp_path / "upstream"
    pkg_dir = upstream / package_root if package_root else upstream
    (pkg_dir / "demo_pkg").mkdir(parents=True)
    (pkg_dir / "demo_pkg" / "__init__.py").write_text("from demo_pkg.core import __version__, greet\n")
    (pkg_dir / "demo_pkg" / "core.py").write_text(CORE_PY)
    (pkg_dir / "demo_pkg" / "util.py").write_text("def double(x):\n    return 2 * x\n")
    (pkg_dir / "demo_pkg" / "native.so").write_bytes(bytes(range(256)) * 4)  # stands for a compiled file
    (pkg_dir / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "demo-engine"
            version = "1.2.0"

            [tool.setuptools.packages.find]
            include = ["demo_pkg*"]

            [tool.setuptools.package-data]
            demo_pkg = ["*.so"]
            """
        )
    )
    (upstream / "README.md").write_text("demo upstream\n")
    git(tmp_path, "init", "-q", "-b", "main", str(upstream))
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "release 1.2.0")
    base = git(upstream, "rev-parse", "HEAD")
    git(upstream, "tag", "v1.2.0")
    git(upstream, "checkout", "-q", "-b", "work")
    files = {f"demo_pkg/{p.name}": p.read_bytes() for p in sorted((pkg_dir / "demo_pkg").iterdir())}
    wheel = make_wheel(tmp_path / "release" / "demo_engine-1.2.0-py3-none-any.whl", files)
    root = tmp_path / "repo"
    (root / "overlays").mkdir(parents=True)
    (root / "patches" / "demo").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "tests" / "test_demo.py").write_text("def test_demo():\n    pass\n")
    world = World(root=root, upstream=upstream, wheel=wheel, base_commit=base, package_root=package_root)
    world.write_manifest()
    (world.series_dir / "series").write_text(f"# base: demo 1.2.0 {base}\n")
    return world


def add_two_patches(world: World) -> list[str]:
    pr = world.package_root + "/" if world.package_root else ""
    world.commit_change(
        f"{pr}demo_pkg/core.py", 'prefix = "hello"', 'prefix = "hi"', "core: shorter greeting"
    )
    world.commit_change(f"{pr}demo_pkg/util.py", "return 2 * x", "return x + x", "util: double by addition")
    return world.export_series()


@dataclass
class CliResult:
    code: int
    out: str
    err: str


Cli = Callable[
    ..., CliResult
]  # the `cli` fixture: run `overlay ARGS...` in-process, capture stdout and stderr


class FallbackAdapter:
    """An adapter for an engine that cannot run here: the check takes its fallback path (no engine process)."""

    engine = "demo"

    def unavailable(self, arm: object) -> str | None:
        return "a test adapter"

    def fallback(self, *, root: Path, reporter: Any) -> dict[str, Any]:
        return {"passed": True, "summary": "0 tests"}

    def census_scenarios(self) -> tuple[str, ...]:
        return ()


def fallback_adapter() -> EngineAdapter:
    """A :class:`FallbackAdapter`, typed as the adapter protocol it stands in for (it has only the fallback part)."""
    return cast("EngineAdapter", FallbackAdapter())
