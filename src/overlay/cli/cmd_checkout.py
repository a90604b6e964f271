"""overlay checkout ENGINE: a git worktree with the pinned upstream as first commit and one commit per patch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import add_command, add_engine, add_json, add_offline, add_wait, resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = "make a git worktree (build/worktrees/ENGINE): pinned upstream, then one commit per patch"
EXAMPLE = "overlay checkout mlx-lm && cd build/worktrees/mlx-lm"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "checkout", HELP, EXAMPLE, execute)
    add_engine(p)
    p.add_argument("--worktree", type=Path, help="where to make it (default: build/worktrees/ENGINE)")
    p.add_argument(
        "--upto", type=int, metavar="N", help="commit only the first N patches (refresh keeps the rest)"
    )
    p.add_argument(
        "--force", action="store_true", help="recreate an existing worktree (its commits are lost)"
    )
    add_offline(p)
    add_wait(p)
    add_json(p, "machine-readable output")


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
