"""Synthetic upstream releases for rebase and review tests: a 1.2.0 release with one function per patch class, and
a 1.3.0 release whose changes make each patch land in its class."""

from __future__ import annotations

import textwrap
from pathlib import Path

from support import World, git, make_wheel, make_world

ENGINE_PY = textwrap.dedent(
    '''\
    """Engine core."""


    def clean_target(x):
        # untouched upstream
        a = x + 1
        return a


    def offset_target(x):
        b = x * 3
        c = b - 1
        return c


    def merged_target(x):
        # upstream edits this comment line
        d = x - 2
        e = d * d
        # tail
        return e


    def conflict_target(x):
        f = x + 10
        return f


    def upstreamed_target(x):
        g = x * 5
        return g


    def equivalent_target(items=[]):
        items.append(1)
        return items


    class Scheduler:
        def plan(self, n):
            steps = list(range(n))
            return steps

        def run(self, n):
            total = 0
            for i in range(n):
                total += i
            return total
    '''
)

LEGACY_PY = (
    "def legacy_sum(a, b):\n    s = a + b\n    return s\n\n\ndef legacy_mul(a, b):\n    return a * b\n"
)
OLD_PY = "def old_api(x):\n    return x\n"

# 1.3.0: what upstream did to each target
RELEASE_EDITS: list[tuple[str, str, str]] = [
    # a new function above offset_target: every later hunk moves down 5 lines
    ("engine.py", "def offset_target(x):", "def new_helper(x):\n    return x\n\n\ndef offset_target(x):"),
    # a context line of our merged_target hunk changes, two lines from our change
    ("engine.py", "# upstream edits this comment line", "# upstream edited this comment"),
    # the very line our conflict patch changes
    ("engine.py", "f = x + 10", "f = x + 11"),
    # upstream makes our upstreamed_target change itself
    ("engine.py", "g = x * 5", "g = 5 * x"),
    # upstream fixes the mutable default like our patch does, and changes a context line as well
    (
        "engine.py",
        "def equivalent_target(items=[]):\n    items.append(1)\n    return items",
        "def equivalent_target(items=None):\n    if items is None:\n        items = []\n    items.append(1)\n    return list(items)",
    ),
    # Scheduler.plan rewritten, Scheduler.run renamed to execute
    (
        "engine.py",
        "    def plan(self, n):\n        steps = list(range(n))\n        return steps",
        "    def plan(self, n):\n        if n <= 0:\n            raise ValueError(n)\n        return [i * 1 for i in range(n)]",
    ),
    ("engine.py", "    def run(self, n):", "    def execute(self, n):"),
]


def make_rebase_world(tmp_path: Path) -> World:
    """make_world's demo engine with engine.py, legacy.py and old.py added to the 1.2.0 release."""
    world = make_world(tmp_path)
    pkg = world.upstream / "python" / "demo_pkg"
    for name, text in (("engine.py", ENGINE_PY), ("legacy.py", LEGACY_PY), ("old.py", OLD_PY)):
        (pkg / name).write_text(text)
    git(world.upstream, "add", "-A")
    git(world.upstream, "commit", "-q", "-m", "release 1.2.0 (more modules)")
    world.base_commit = git(world.upstream, "rev-parse", "HEAD")
    git(world.upstream, "tag", "-f", "v1.2.0")
    make_wheel(world.wheel, {f"demo_pkg/{p.name}": p.read_bytes() for p in sorted(pkg.iterdir())})
    world.write_manifest()
    (world.series_dir / "series").write_text(f"# base: demo 1.2.0 {world.base_commit}\n")
    return world


def release_files(
    world: World,
    edits: list[tuple[str, str, str]] | None = None,
    *,
    rename_legacy: bool = True,
    delete_old: bool = True,
) -> dict[str, bytes]:
    files = {}
    for rel in git(world.upstream, "ls-tree", "-r", "--name-only", "v1.2.0", "python/demo_pkg").splitlines():
        files[rel[len("python/") :]] = git_bytes(world.upstream, f"v1.2.0:{rel}")
    for name, old, new in RELEASE_EDITS if edits is None else edits:
        key = f"demo_pkg/{name}"
        text = files[key].decode()
        assert old in text, (name, old)
        files[key] = text.replace(old, new, 1).encode()
    if rename_legacy:
        files["demo_pkg/compat.py"] = files.pop("demo_pkg/legacy.py").replace(
            b"return a * b", b"return b * a"
        )
    if delete_old:
        del files["demo_pkg/old.py"]
    return files


def git_bytes(repo: Path, spec: str) -> bytes:
    import os
    import subprocess

    from support import GIT_ENV

    return subprocess.run(
        ["git", "show", spec], cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, check=True
    ).stdout


def make_release(world: World, version: str = "1.3.0", files: dict[str, bytes] | None = None) -> Path:
    """The upstream release wheel ``version`` (default: 1.2.0 with RELEASE_EDITS, legacy.py renamed, old.py gone)."""
    files = release_files(world) if files is None else files
    return make_wheel(world.wheel.parent / f"demo_engine-{version}-py3-none-any.whl", files, version=version)


PKG = "python/demo_pkg/"

# (file, old, new, subject) of one patch per class, written against 1.2.0
PATCHES = {
    "util": ("util.py", "return 2 * x", "return x + x", "util: double by addition"),
    "clean": ("engine.py", "a = x + 1", "a = 1 + x", "engine: clean_target adds the other way round"),
    "offset": ("engine.py", "c = b - 1", "c = b - 2", "engine: offset_target subtracts two"),
    "merged": ("engine.py", "e = d * d", "e = d ** 2", "engine: merged_target squares with pow"),
    "conflict": ("engine.py", "f = x + 10", "f = x + 12", "engine: conflict_target adds twelve"),
    "upstreamed": ("engine.py", "g = x * 5", "g = 5 * x", "engine: upstreamed_target commutes"),
    "equivalent": (
        "engine.py",
        "def equivalent_target(items=[]):\n    items.append(1)",
        "def equivalent_target(items=None):\n    if items is None:\n        items = []\n    items.append(1)",
        "engine: equivalent_target avoids the mutable default",
    ),
    "renamed": ("legacy.py", "s = a + b", "s = b + a", "legacy: sum the other way round"),
    "gone": ("old.py", "return x", "return x + 0", "old: old_api adds zero"),
    "plan": (
        "engine.py",
        "steps = list(range(n))",
        "steps = list(range(n))  # planned",
        "engine: note in plan",
    ),
    "run": ("engine.py", "total += i", "total = total + i", "engine: run accumulates explicitly"),
}


def add_patches(world: World, kinds: list[str]) -> list[str]:
    for kind in kinds:
        name, old, new, subject = PATCHES[kind]
        world.commit_change(PKG + name, old, new, subject)
    return world.export_series()
