"""overlay install ENGINE [--python PATH]: replace a verified stock installation with the patched wheel."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import (
    add_command,
    add_engine,
    add_json,
    add_offline,
    add_python,
    resolve_root,
    resolved,
)
from overlay.cli.output import emit_json, reporter_for

HELP = (
    "replace the verified pinned stock installation in an environment with the patched wheel, then verify it"
)
EXAMPLE = "overlay install mlx-lm --python /opt/venv/bin/python"


def show_action(result: Any, *, as_json: bool) -> None:
    """What install or revert did: the before and after of the environment, as JSON or one line."""
    if as_json:
        emit_json(_action_json(result))
    else:
        print(
            f"{result.action} {result.after.distribution} {result.after.version} ({result.after.kind}, was "
            f"{result.before.kind} {result.before.version}) at {result.after.location}"
        )


def _action_json(result: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "action": result.action,
        "engine": result.after.engine,
        "before": {"version": result.before.version, "kind": result.before.kind},
        "after": {
            "version": result.after.version,
            "kind": result.after.kind,
            "location": str(result.after.location),
        },
        "wheel": str(result.wheel),
        "import": str(result.import_path),
    }


def configure_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "install",
        HELP,
        EXAMPLE,
        execute,
        notes="Refused when the installed files do not match the pinned artifact's RECORD (exit 5) or another "
        "release is installed (exit 2). pip runs with --no-deps --force-reinstall --no-index.",
    )
    add_engine(p)
    add_python(p)
    p.add_argument(
        "--wheels",
        type=Path,
        metavar="DIR",
        help="where `overlay apply` put the wheels (default: build/wheels/ENGINE)",
    )
    add_offline(p)
    add_json(p)


def execute(args: argparse.Namespace) -> int:
    from overlay.deploy.install import install_engine

    root = resolve_root(args)
    result = install_engine(
        root=root,
        engine=args.engine,
        python=args.python,
        wheels_dir=resolved(args.wheels),
        offline=args.offline,
        reporter=reporter_for(args),
    )
    show_action(result, as_json=args.json)
    return 0
