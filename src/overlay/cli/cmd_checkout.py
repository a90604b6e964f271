"""overlay checkout ENGINE: a git worktree with the pinned upstream as first commit and one commit per patch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = "make a git worktree (build/worktrees/ENGINE): pinned upstream, then one commit per patch"
EXAMPLE = "overlay checkout mlx-lm && cd build/worktrees/mlx-lm"


def configure_parser(sub: Any) -> None:
    p = sub.add_parser(
        "checkout",
        help=HELP,
        description=f"{HELP}.\n\nexample: {EXAMPLE}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("engine", help="engine name (overlays/ENGINE.toml)")
    p.add_argument("--worktree", type=Path, help="where to make it (default: build/worktrees/ENGINE)")
    p.add_argument(
        "--upto", type=int, metavar="N", help="commit only the first N patches (refresh keeps the rest)"
    )
    p.add_argument(
        "--force", action="store_true", help="recreate an existing worktree (its commits are lost)"
    )
    p.add_argument("--offline", action="store_true", help="use cached artifacts only")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when another overlay run holds the engine's lock, wait up to SECONDS for it (default: fail at once)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> int:
    from overlay.stack.checkout import checkout

    root = resolve_root(args)
    result = checkout(
        root=root,
        engine=args.engine,
        worktree=args.worktree,
        upto=args.upto,
        force=args.force,
        offline=args.offline,
        wait=args.wait,
        reporter=reporter_for(args),
    )
    if args.json:
        emit_json(
            {
                "version": 1,
                "worktree": str(result.worktree),
                "base": result.base,
                "commits": [{"commit": c, "patch": n} for c, n in result.commits],
            }
        )
    else:
        print(result.worktree)
    return 0
