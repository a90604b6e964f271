"""overlay publish ENGINE --to DIR: the patched wheels as a static package index with hashes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = "write the patched wheels of every pinned artifact as a static package index (PEP 503/691) with hashes"
EXAMPLE = "overlay publish mlx-lm --to build/index"


def configure_parser(sub: Any) -> None:
    p = sub.add_parser(
        "publish",
        help=HELP,
        description=f"{HELP}.\n\nexample: {EXAMPLE}\n\nDIR gets the wheels, "
        "simple/ (HTML and JSON), requirements.txt (--hash per artifact), constraints.txt and "
        "requirements-stock.txt; see docs/deploy.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("engine", help="engine name (overlays/ENGINE.toml)")
    p.add_argument(
        "--to",
        type=Path,
        required=True,
        metavar="DIR",
        help="the index folder (new, empty, or one publish wrote before: replaced whole)",
    )
    p.add_argument(
        "--wheels",
        type=Path,
        metavar="DIR",
        help="where `overlay apply` put the wheels (default: build/wheels/ENGINE)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> int:
    from overlay.deploy.publish import publish_index

    root = resolve_root(args)
    pub = publish_index(
        root=root,
        engine=args.engine,
        to=args.to.resolve(),
        wheels_dir=args.wheels.resolve() if args.wheels else None,
        reporter=reporter_for(args),
    )
    if args.json:
        emit_json(
            {
                "version": 1,
                "to": str(pub.to),
                "project": pub.project,
                "wheel_version": pub.version,
                "files": [
                    {"filename": f.filename, "sha256": f.sha256, "artifact": f.artifact.filename}
                    for f in pub.files
                ],
            }
        )
    else:
        print(pub.to)
    return 0
