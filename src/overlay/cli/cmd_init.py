"""overlay init ENGINE --version V [--root DIR]: a new overlay repository for a release on the package index."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import add_command, add_json, current_dir
from overlay.cli.output import emit_json, reporter_for

HELP = (
    "create an overlay repository (or add an engine to one) for a release on the package index: the manifest "
    "pinning every file of the release with sha256, patches/ENGINE/series, build/ in .gitignore, git init"
)
EXAMPLE = "overlay init mlx-lm --version 0.32.1 --root my-patches"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "init", HELP, EXAMPLE, execute)
    p.add_argument("engine", help="engine name: overlays/ENGINE.toml and patches/ENGINE/ are created")
    p.add_argument(
        "--version",
        required=True,
        metavar="V",
        dest="upstream_version",
        help="the upstream release to pin (a version the package index has)",
    )
    p.add_argument(
        "--root",
        type=Path,
        default=argparse.SUPPRESS,
        help="the folder to create it in (default: the current directory); created when missing",
    )
    p.add_argument(
        "--distribution", metavar="NAME", help="the distribution on the package index (default: ENGINE)"
    )
    p.add_argument(
        "--git",
        metavar="URL",
        help="the upstream git repository (default: the source URL the release's metadata names)",
    )
    p.add_argument(
        "--import-name", metavar="NAME", help="the engine's top-level package (default: read from the wheel)"
    )
    p.add_argument(
        "--package-root",
        default="",
        metavar="DIR",
        help="the folder of the git repository that is the wheel's root (default: the repository root)",
    )
    add_json(p)


def execute(args: argparse.Namespace) -> int:
    from overlay.upstream.init import describe, init_repository

    root: Path | None = args.root
    if root is None or not root.is_absolute():
        root = current_dir(needed_for="overlay init") / (root or ".")
    res = init_repository(
        root=root.resolve(),
        engine=args.engine,
        version=args.upstream_version,
        distribution=args.distribution,
        git=args.git,
        import_name=args.import_name,
        package_root=args.package_root,
        reporter=reporter_for(args),
    )
    if args.json:
        emit_json(describe(res))
        return 0
    e = res.engine
    for path in res.written:
        print(f"wrote {path.relative_to(res.root)}")
    if res.git_initialized:
        print(f"git init {res.root}")
    print(
        f"{e}: {res.distribution} {res.version}, {len(res.artifacts)} release files pinned with sha256 "
        f"(primary {res.artifacts[0].filename}); import name {res.import_name}; git {res.git}"
    )
    for name in res.skipped_yanked:
        print(f"NOTE {name} is yanked on the index and was not pinned")
    root_opt = "" if res.root == current_dir() else f" --root {res.root}"
    print(f"""
next steps:
  overlay{root_opt} checkout {e}      # the release as a git repository, build/worktrees/{e}
  # edit there and `git commit` once per patch; the message says what changes, why and what was measured,
  # and ends with these trailers (docs/dev/patch-authoring.md):
  #   Overlay-Theme: other              (or cuda-graph, h2d-sync, sampling-fusion, loading, platform, ...)
  #   Overlay-Numerics: exact           (exact | lossless | approximate)
  #   Overlay-Check: tests/test_{e.replace("-", "_")}.py::test_name   (a test or script in this repository;
  #                                     with no tests/ folder here lint warns instead of failing)
  #   Upstream-Status: Pending          (Submitted URL | Backport URL | Inappropriate REASON)
  #   Overlay-Flag: default             (what turns it on: ENV=VALUE, a --cli-option, or default)
  overlay{root_opt} refresh {e}       # the commits become patches/{e}/NNNN-*.patch and series
  overlay{root_opt} lint {e}          # trailers, series, every patch applies exactly
  overlay{root_opt} apply {e}         # the patched wheel, its path printed last
  overlay{root_opt} pin {e} --commit SHA   # optional: the upstream commit (apply --source git, rebase)""")
    return 0
