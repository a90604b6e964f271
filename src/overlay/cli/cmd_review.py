"""overlay review ENGINE --from A --to B [--html FILE]: upstream changes in the code our patches touch, range-diff."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import add_command, add_engine, add_json, add_offline, resolve_root, resolved
from overlay.cli.output import emit_json, reporter_for

HELP = "what upstream changed between two releases in the functions and classes our patches touch, and a range-diff"
EXAMPLE = "overlay review mlx-lm --from 0.31.2 --to 0.32.2 --html build/reports/mlx-lm-review.html"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "review", HELP, EXAMPLE, execute)
    add_engine(p)
    p.add_argument(
        "--from", dest="from_version", required=True, metavar="A", help="the older upstream release"
    )
    p.add_argument("--to", dest="to_version", required=True, metavar="B", help="the newer upstream release")
    p.add_argument("--html", type=Path, metavar="FILE", help="also write a self-contained HTML report")
    p.add_argument(
        "--old-series",
        type=Path,
        metavar="DIR",
        help="the series at A (a folder with series + patches), when neither patches/ENGINE, the rebase "
        "history nor git history has it",
    )
    p.add_argument(
        "--from-url", metavar="URL", help="a direct location of A's wheel instead of the package index"
    )
    p.add_argument(
        "--to-url", metavar="URL", help="a direct location of B's wheel instead of the package index"
    )
    add_offline(p)
    add_json(p, "print the report as JSON")


def execute(args: argparse.Namespace) -> int:
    from overlay.upstream.review import review
    from overlay.upstream.review.model import summary_lines, to_json

    root = resolve_root(args)
    result = review(
        root=root,
        engine=args.engine,
        from_version=args.from_version,
        to_version=args.to_version,
        old_series=resolved(args.old_series),
        from_url=args.from_url,
        to_url=args.to_url,
        html=resolved(args.html),
        offline=args.offline,
        reporter=reporter_for(args),
    )
    if args.json:
        emit_json(to_json(result))
    else:
        for line in summary_lines(result):
            print(line)
        print(f"report: {result.json_path}" + (f"  html: {result.html_path}" if result.html_path else ""))
    return 0
