"""overlay revert ENGINE [--python PATH]: put the pinned stock bytes back, verified."""

from __future__ import annotations

import argparse
from typing import Any

from overlay.cli.cmd_install import show_action
from overlay.cli.common import add_command, add_engine, add_json, add_offline, add_python, resolve_root
from overlay.cli.output import reporter_for

HELP = "reinstall the pinned stock artifact in an environment (the rollback) and verify it against its RECORD"
EXAMPLE = "overlay revert mlx-lm --python /opt/venv/bin/python"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "revert", HELP, EXAMPLE, execute)
    add_engine(p)
    add_python(p)
    add_offline(p)
    add_json(p)


def execute(args: argparse.Namespace) -> int:
    from overlay.deploy.install import revert_engine

    root = resolve_root(args)
    result = revert_engine(
        root=root, engine=args.engine, python=args.python, offline=args.offline, reporter=reporter_for(args)
    )
    show_action(result, as_json=args.json)
    return 0
