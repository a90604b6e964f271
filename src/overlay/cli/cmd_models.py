"""overlay models list|build KIND: the bundled tiny models (generated locally, cached under build/models)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from overlay.cli.common import add_command, resolve_root
from overlay.progress import Stage

HELP = "list or build the bundled tiny models (random or briefly trained; no downloads)"
EXAMPLE = "overlay models build llama-target"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "models", HELP, EXAMPLE, execute)
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    b = msub.add_parser("build", help="build a kind (or find it in the cache) and print its folder")
    b.add_argument("kind", help="a kind from `overlay models list`")
    b.add_argument("--seed", type=int, default=0, help="initialisation and data-order seed (default 0)")
    b.add_argument(
        "--python",
        help="interpreter with mlx and mlx-lm for trained kinds; 'stock' (default when this "
        "Python lacks mlx) = the stock mlx-lm arm's venv",
    )
    ls = msub.add_parser("list", help="list the kinds and whether they are built")
    ls.add_argument("--json", action="store_true", help="machine-readable output")


class _StderrReporter:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def step(self, stage: Stage, message: str) -> None:
        if not self.quiet:
            print(f"{stage}: {message}", file=sys.stderr, flush=True)

    def advance(self, stage: Stage, done: int, total: int) -> None:
        pass


def execute(args: argparse.Namespace) -> int:
    import importlib.util

    from overlay.core.extras import require_extra

    require_extra("check", command="models")  # before overlay.check.models imports numpy
    root = resolve_root(args)
    if args.models_command == "build":
        from overlay.check.models.recipes import KINDS, is_trained

        # trained kinds need mlx: this interpreter's, or the stock mlx-lm arm's (random kinds need neither)
        needs_mlx = args.kind in KINDS and is_trained(args.kind) and importlib.util.find_spec("mlx") is None
        python = args.python or ("stock" if needs_mlx else None)
        return _build(root=root, kind=args.kind, seed=args.seed, python=python, quiet=args.verbosity < 0)
    return _list(root=root, as_json=args.json)


def _build(*, root: Path, kind: str, seed: int, python: str | None, quiet: bool) -> int:
    from overlay.check.models.builder import build
    from overlay.check.models.mlxproc import stock_mlx_python

    reporter = _StderrReporter(quiet)
    interp: Path | None = None
    if python == "stock":
        interp = stock_mlx_python(root, reporter=reporter)
    elif python:
        interp = Path(python)
    print(build(kind, root=root, seed=seed, python=interp, reporter=reporter))
    return 0


def _list(*, root: Path, as_json: bool) -> int:
    from overlay.check.models.builder import is_built, model_dir
    from overlay.check.models.recipes import KINDS, is_trained

    rows = [
        {
            "kind": kind,
            "trained": is_trained(kind),
            "description": recipe.description,
            "dir": str(model_dir(kind, root=root)),
            "built": is_built(kind, root=root),
        }
        for kind, recipe in KINDS.items()
    ]
    if as_json:
        print(json.dumps({"version": 1, "kinds": rows}, indent=2))
        return 0
    for row in rows:
        flag = "trained" if row["trained"] else "random "
        print(f"{row['kind']:<20} {flag}  {row['description']}  [{'built' if row['built'] else 'not built'}]")
    return 0
