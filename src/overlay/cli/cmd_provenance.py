"""overlay provenance WHEEL|DISTNAME: the provenance of a built wheel or an installed distribution."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import add_command, add_json, resolve_root
from overlay.cli.output import emit_json

HELP = "verify and print the provenance of a patched wheel file or of an installed distribution"
EXAMPLE = "overlay provenance build/wheels/mlx-lm/mlx_lm-0.32.2+ovl.1.g1234abcd-py3-none-any.whl"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "provenance", HELP, EXAMPLE, execute)
    p.add_argument("target", help="a .whl file, or the name of an installed distribution")
    p.add_argument(
        "--path",
        action="append",
        metavar="DIR",
        help="look for the installed distribution in DIR (a site-packages folder) instead of sys.path",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="also check every patch named in overlay.json against patches/ENGINE/ in the overlay "
        "repository (--root)",
    )
    add_json(p, "print overlay.json as is")


def execute(args: argparse.Namespace) -> int:
    from overlay.core.provenance import (
        read_from_installed,
        read_from_wheel,
        summary_lines,
        verify_against_root,
    )

    target = Path(args.target)
    if args.target.endswith(".whl") or target.is_file():
        prov = read_from_wheel(target)
    else:
        prov = read_from_installed(args.target, path=args.path)
    if args.verify:
        prov = verify_against_root(prov, resolve_root(args))
    if args.json:
        emit_json(prov.data)
    else:
        print(f"# {prov.where}")
        for line in summary_lines(prov):
            print(line)
    return 0
