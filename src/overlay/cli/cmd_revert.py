"""overlay revert ENGINE [--python PATH]: put the pinned stock bytes back, verified."""

from __future__ import annotations

import argparse
from typing import Any

from overlay.cli.cmd_install import action_json, add_python
from overlay.cli.common import resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = "reinstall the pinned stock artifact in an environment (the rollback) and verify it against its RECORD"
EXAMPLE = "overlay revert mlx-lm --python /opt/venv/bin/python"


def configure_parser(sub: Any) -> None:
    p = sub.add_parser(
        "revert",
        help=HELP,
        description=f"{HELP}.\n\nexample: {EXAMPLE}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("engine", help="engine name (overlays/ENGINE.toml)")
    add_python(p)
    p.add_argument("--offline", action="store_true", help="use cached artifacts only")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> int:
    from overlay.deploy.install import revert_engine

    root = resolve_root(args)
    result = revert_engine(
        root=root, engine=args.engine, python=args.python, offline=args.offline, reporter=reporter_for(args)
    )
    if args.json:
        emit_json(action_json(result))
    else:
        print(
            f"{result.action} {result.after.distribution} {result.after.version} ({result.after.kind}, was "
            f"{result.before.kind} {result.before.version}) at {result.after.location}"
        )
    return 0
