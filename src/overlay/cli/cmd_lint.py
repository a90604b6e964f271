"""overlay lint [ENGINE]: trailers, series <-> folder consistency, every patch applies exactly."""

from __future__ import annotations

import argparse
from typing import Any

from overlay.cli.common import add_command, add_json, add_offline, resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = "check trailers, series <-> folder consistency, and that every patch applies exactly at the pin"
EXAMPLE = "overlay lint mlx-lm"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "lint", HELP, EXAMPLE, execute)
    p.add_argument("engine", nargs="?", help="engine name (default: all engines)")
    p.add_argument(
        "--against",
        metavar="VERSION",
        help="also check that every patch still lands, offsets at most, in the same function/class on "
        "release VERSION (the hunk-location check)",
    )
    add_offline(p)
    add_json(p, "machine-readable output")


def execute(args: argparse.Namespace) -> int:
    import sys

    from overlay.core.lint import lint_engine
    from overlay.core.manifest import engine_names, load_engine

    root = resolve_root(args)
    engines = [args.engine] if args.engine else engine_names(root)
    if args.engine:
        load_engine(root, args.engine)  # unknown engine -> exit 2 with the closest name
    reports = [lint_engine(root, e, offline=args.offline, reporter=reporter_for(args)) for e in engines]
    if getattr(args, "against", None):
        reports = [_with_locations(root, r, args.against, args.offline, reporter_for(args)) for r in reports]
    if args.json:
        emit_json(
            {
                "version": 1,
                "engines": [
                    {
                        "engine": r.engine,
                        "patches": r.patches,
                        "ok": r.ok,
                        "warnings": list(r.warnings),
                        "problems": [
                            {"patch": p.patch, "kind": p.kind, "message": p.message, "tip": p.tip}
                            for p in r.problems
                        ],
                    }
                    for r in reports
                ],
            }
        )
    else:
        for r in reports:
            for w in r.warnings:
                print(f"WARNING {r.engine}: {w}", file=sys.stderr)
            if r.ok:
                against = f"; every hunk lands in the same symbol at {args.against}" if args.against else ""
                print(f"{r.engine}: ok ({r.patches} patches apply exactly{against})")
            for p in r.problems:
                where = f"{r.engine}/{p.patch}" if p.patch else r.engine
                print(f"ERROR {where}: {p.message}", file=sys.stderr)
                if p.tip:
                    print(f"TIP {p.tip}", file=sys.stderr)
    problems = [p for r in reports for p in r.problems]
    if any(p.kind == "integrity" for p in problems):
        return 5
    if any(p.kind in ("apply", "location") for p in problems):
        return 3
    return 2 if problems else 0


def _with_locations(root: Any, report: Any, version: str, offline: bool, reporter: Any) -> Any:
    """``--against VERSION``: add the hunk-location check's problems (only for an engine that lints clean)."""
    import dataclasses

    from overlay.core.manifest import load_engine
    from overlay.core.series import load_engine_series
    from overlay.upstream.placement import location_problems

    if not report.ok:
        return report
    manifest = load_engine(root, report.engine)
    found = location_problems(
        root, manifest, load_engine_series(root, manifest), version, offline=offline, reporter=reporter
    )
    return dataclasses.replace(report, problems=report.problems + tuple(found))
