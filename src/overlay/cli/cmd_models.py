"""overlay models list|build KIND: the bundled tiny models (generated locally, cached under build/models)."""

from __future__ import annotations

import argparse
from typing import Any

from overlay.cli.main import resolve_root

HELP = "list or build the bundled tiny models (random or briefly trained; no downloads)"
EXAMPLE = "overlay models build llama-target"


def configure_parser(sub: Any) -> None:
    p = sub.add_parser("models", help=HELP, description=f"{HELP}.\n\nexample: {EXAMPLE}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    b = msub.add_parser("build", help="build a kind (or find it in the cache) and print its folder")
    b.add_argument("kind", help="a kind from `overlay models list`")
    b.add_argument("--seed", type=int, default=0, help="initialisation and data-order seed (default 0)")
    b.add_argument("--python", help="interpreter with mlx and mlx-lm for trained kinds; 'stock' (default when this "
                                    "Python lacks mlx) = the stock mlx-lm arm's venv")
    ls = msub.add_parser("list", help="list the kinds and whether they are built")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> int:
    import importlib.util

    from overlay.extras import require_extra

    require_extra("check", command="models")  # before overlay.tinymodels imports numpy
    from overlay.tinymodels.cli import run_build, run_list

    root = resolve_root(args)
    if args.models_command == "build":
        python = args.python or ("stock" if importlib.util.find_spec("mlx") is None else None)
        return run_build(root=root, kind=args.kind, seed=args.seed, python=python, quiet=args.verbosity < 0)
    return run_list(root=root, as_json=args.json)
