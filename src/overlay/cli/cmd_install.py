"""overlay install ENGINE [--python PATH]: replace a verified stock installation with the patched wheel."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = (
    "replace the verified pinned stock installation in an environment with the patched wheel, then verify it"
)
EXAMPLE = "overlay install mlx-lm --python /opt/venv/bin/python"


def add_python(p: Any) -> None:
    p.add_argument(
        "--python",
        type=Path,
        metavar="PATH",
        help="the environment's interpreter (default: the one running overlay)",
    )


def action_json(result: Any) -> dict[str, Any]:
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
    p = sub.add_parser(
        "install",
        help=HELP,
        description=f"{HELP}.\n\nexample: {EXAMPLE}\n\nRefused when the "
        "installed files do not match the pinned artifact's RECORD (exit 5) or another release is "
        "installed (exit 2). pip runs with --no-deps --force-reinstall --no-index.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("engine", help="engine name (overlays/ENGINE.toml)")
    add_python(p)
    p.add_argument(
        "--wheels",
        type=Path,
        metavar="DIR",
        help="where `overlay apply` put the wheels (default: build/wheels/ENGINE)",
    )
    p.add_argument("--offline", action="store_true", help="use cached artifacts only")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(execute=execute)


def execute(args: argparse.Namespace) -> int:
    from overlay.deploy.install import install_engine

    root = resolve_root(args)
    result = install_engine(
        root=root,
        engine=args.engine,
        python=args.python,
        wheels_dir=args.wheels.resolve() if args.wheels else None,
        offline=args.offline,
        reporter=reporter_for(args),
    )
    if args.json:
        emit_json(action_json(result))
    else:
        print(
            f"{result.action} {result.after.distribution} {result.after.version} ({result.after.kind}, was "
            f"{result.before.kind} {result.before.version}) at {result.after.location}"
        )
    return 0
