"""overlay refresh ENGINE: write the worktree's commits back to patches/ENGINE (files, numbering, series)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from overlay.cli.common import add_command, add_engine, add_json, add_wait, resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = "regenerate patches/ENGINE from the checkout worktree (unchanged commits keep their bytes)"
EXAMPLE = "overlay refresh mlx-lm --dry-run"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "refresh", HELP, EXAMPLE, execute)
    add_engine(p)
    p.add_argument("--worktree", type=Path, help="the worktree (default: build/worktrees/ENGINE)")
    p.add_argument(
        "--force",
        action="store_true",
        help="refresh even from a dirty worktree or one whose base is not the current pin",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    add_wait(p)
    add_json(p, "machine-readable output")


def execute(args: argparse.Namespace) -> int:
    from overlay.stack.refresh import refresh

    root = resolve_root(args)
    r = refresh(
        root=root,
        engine=args.engine,
        worktree=args.worktree,
        force=args.force,
        dry_run=args.dry_run,
        wait=args.wait,
        reporter=reporter_for(args),
    )
    if args.json:
        emit_json(
            {
                "version": 1,
                "written": list(r.written),
                "kept": list(r.kept),
                "removed": list(r.removed),
                "series_changed": r.series_changed,
                "dry_run": args.dry_run,
                "warnings": list(r.warnings),
            }
        )
    else:
        verb = "would write" if args.dry_run else "wrote"
        for n in r.written:
            print(f"{verb} {n}")
        for n in r.removed:
            print(f"{'would remove' if args.dry_run else 'removed'} {n}")
        if not r.written and not r.removed and not r.series_changed:
            print("nothing to do: the series matches the worktree")
    for w in r.warnings:
        print(f"WARNING {w}", file=sys.stderr)
    return 0
