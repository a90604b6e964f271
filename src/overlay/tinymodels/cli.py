"""``python -m overlay.tinymodels``: ``build KIND [--root DIR] [--seed N] [--python PATH|stock]`` and ``list``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from overlay.errors import OverlayError, UsageError
from overlay.progress import Stage
from overlay.tinymodels.builder import build, is_built, model_dir, stock_mlx_python
from overlay.tinymodels.recipes import KINDS, is_trained


class _StderrReporter:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def step(self, stage: Stage, message: str) -> None:
        if not self.quiet:
            print(f"{stage}: {message}", file=sys.stderr, flush=True)

    def advance(self, stage: Stage, done: int, total: int) -> None:
        pass


def _root(value: Path | None) -> Path:
    if value is not None:
        return value.resolve()
    from overlay.manifest import find_root

    try:
        return find_root(Path.cwd())
    except OverlayError:
        raise UsageError("no overlay repository above the current directory", tip="pass --root DIR") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m overlay.tinymodels",
                                     description="Build the bundled tiny models (generated locally, cached).")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    b = sub.add_parser("build", help="build a kind (or find it in the cache) and print its directory",
                       description="example: python -m overlay.tinymodels build llama-random --root .")
    b.add_argument("kind", help="a kind from `list`")
    b.add_argument("--root", type=Path, help="the overlay repository (default: nearest folder above with overlays/)")
    b.add_argument("--seed", type=int, default=0, help="initialisation and data-order seed (default 0)")
    b.add_argument("--python", help="interpreter with mlx and mlx-lm for trained kinds; 'stock' = the stock "
                                    "mlx-lm arm of overlay.envs (default: this interpreter if it has mlx)")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    ls = sub.add_parser("list", help="list the kinds",
                        description="example: python -m overlay.tinymodels list --json")
    ls.add_argument("--root", type=Path, help="show cache state for this repository")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def run_build(*, root: Path, kind: str, seed: int = 0, python: str | None = None, quiet: bool = False) -> int:
    """Build ``kind`` (or find it) and print its folder; shared by ``overlay models build``."""
    reporter = _StderrReporter(quiet)
    interp: Path | None = None
    if python == "stock":
        interp = stock_mlx_python(root, reporter=reporter)
    elif python:
        interp = Path(python)
    path = build(kind, root=root, seed=seed, python=interp, reporter=reporter)
    print(path)
    return 0


def run_list(*, root: Path | None, as_json: bool) -> int:
    """List the kinds (with cache state when ``root`` is given); shared by ``overlay models list``."""
    rows = []
    for kind, recipe in KINDS.items():
        row = {"kind": kind, "trained": is_trained(kind), "description": recipe.description}
        if root is not None:
            row["dir"] = str(model_dir(kind, root=root))
            row["built"] = is_built(kind, root=root)
        rows.append(row)
    if as_json:
        print(json.dumps({"version": 1, "kinds": rows}, indent=2))
        return 0
    for row in rows:
        flag = "trained" if row["trained"] else "random "
        built = "" if root is None else ("  [built]" if row["built"] else "  [not built]")
        print(f"{row['kind']:<20} {flag}  {row['description']}{built}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        if args.command == "build":
            return run_build(root=_root(args.root), kind=args.kind, seed=args.seed, python=args.python, quiet=args.quiet)
        return run_list(root=args.root.resolve() if args.root else None, as_json=args.json)
    except OverlayError as exc:
        from overlay.cli.output import print_error

        return print_error(exc, debug=args.debug)
