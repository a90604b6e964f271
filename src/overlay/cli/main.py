"""`overlay` entry point: global options, one sub-command per module, errors caught once."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from overlay import __version__
from overlay.errors import OverlayError
from overlay.manifest import find_root


def command_modules() -> list[ModuleType]:
    from overlay.cli import cmd_apply, cmd_fetch, cmd_lint, cmd_list, cmd_provenance

    return [cmd_list, cmd_fetch, cmd_lint, cmd_apply, cmd_provenance, *_optional_commands()]


def _optional_commands() -> list[ModuleType]:
    import importlib

    mods = []
    for name in ("cmd_checkout", "cmd_refresh", "cmd_rebase", "cmd_review", "cmd_check", "cmd_models"):
        try:
            mods.append(importlib.import_module(f"overlay.cli.{name}"))
        except ModuleNotFoundError as exc:
            if exc.name != f"overlay.cli.{name}":
                raise
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="overlay",
        description="Pinned, strictly applied performance patch series for LLM serving engines, built into drop-in wheels.",
    )
    parser.add_argument("--version", action="version", version=f"overlay {__version__}")
    parser.add_argument("--root", type=Path, help="the overlay repository (default: nearest folder above with overlays/)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=0,
                        help="no progress lines")
    parser.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1, help="more progress")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in command_modules():
        mod.configure_parser(sub)
    return parser


def resolve_root(args: argparse.Namespace) -> Path:
    root: Path | None = args.root
    if root is not None:
        root = root.resolve()
        if not (root / "overlays").is_dir():
            from overlay.errors import UsageError

            raise UsageError(f"--root {root} has no overlays/ folder")
        return root
    return find_root(Path.cwd())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    try:
        result: int = args.execute(args)
        return result
    except OverlayError as exc:
        from overlay.cli.output import print_error

        return print_error(exc, debug=args.debug)
    except KeyboardInterrupt:
        print("ERROR interrupted; nothing was published (scratch files are removed on the next run)", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors are reported
        if args.debug:
            traceback.print_exc()
        print(f"ERROR unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        print("TIP run again with --debug for a traceback, and report it", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
