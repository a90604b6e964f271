"""overlay publish ENGINE --to DIR: the patched wheels as a static package index with hashes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import add_command, add_engine, add_json, resolve_root, resolved
from overlay.cli.output import emit_json, reporter_for

HELP = "write the patched wheels of every pinned artifact as a static package index (PEP 503/691) with hashes"
EXAMPLE = "overlay publish mlx-lm --to build/index"


def configure_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "publish",
        HELP,
        EXAMPLE,
        execute,
        notes="DIR gets the wheels, simple/ (HTML and JSON), requirements.txt (--hash per artifact), "
        "constraints.txt and requirements-stock.txt; see docs/deploy.md.",
    )
    add_engine(p)
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
    add_json(p)


def execute(args: argparse.Namespace) -> int:
    from overlay.deploy.publish import publish_index

    root = resolve_root(args)
    pub = publish_index(
        root=root,
        engine=args.engine,
        to=args.to.resolve(),
        wheels_dir=resolved(args.wheels),
        reporter=reporter_for(args),
    )
    if args.json:
        emit_json(
            {
                "version": 1,
                "to": str(pub.to),
                "project": pub.project,
                "projects": [pr.name for pr in pub.projects],
                "wheel_version": pub.version,
                "files": [
                    {
                        "filename": f.filename,
                        "project": f.project,
                        "sha256": f.sha256,
                        "artifact": f.artifact.filename,
                    }
                    for f in pub.files
                ],
            }
        )
    else:
        print(pub.to)
    return 0
