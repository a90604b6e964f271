"""overlay fetch ENGINE: download the pinned upstream artifact(s), verify sha256, cache under build/cache."""

from __future__ import annotations

import argparse
from typing import Any

from overlay.cli.common import add_command, add_engine, add_json, resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = "download the pinned upstream artifacts, verify sha256, cache them under build/cache"
EXAMPLE = "overlay fetch mlx-lm"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "fetch", HELP, EXAMPLE, execute)
    add_engine(p)
    p.add_argument(
        "--offline", action="store_true", help="use the cache only; fail if an artifact is missing"
    )
    add_json(p, "machine-readable output")


def execute(args: argparse.Namespace) -> int:
    from overlay.core.fetch import fetch_all
    from overlay.core.manifest import load_engine

    root = resolve_root(args)
    manifest = load_engine(root, args.engine)
    paths = fetch_all(root, manifest, offline=args.offline, reporter=reporter_for(args))
    if args.json:
        emit_json(
            {
                "version": 1,
                "engine": manifest.name,
                "artifacts": [
                    {"filename": a.filename, "sha256": a.sha256, "path": str(p)}
                    for a, p in zip(manifest.upstream.artifacts, paths)
                ],
            }
        )
    else:
        for p in paths:
            print(p)
    return 0
