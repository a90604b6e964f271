"""`overlay` entry point: global options, one sub-command per module, errors caught once.

Besides the error classes' codes (overlay.errors), two exits come from the terminal: 130 when interrupted (Ctrl-C)
and 141 (128 + SIGPIPE, what git and coreutils give) when the reader of stdout went away (`overlay list | head -1`);
the latter is quiet, like pip, with no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from overlay import __version__
from overlay.errors import OverlayError


def command_modules() -> list[ModuleType]:
    from overlay.cli import cmd_apply, cmd_fetch, cmd_lint, cmd_list, cmd_provenance

    return [cmd_list, cmd_fetch, cmd_lint, cmd_apply, cmd_provenance, *_optional_commands()]


def _optional_commands() -> list[ModuleType]:
    import importlib

    mods = []
    for name in (
        "cmd_init",
        "cmd_checkout",
        "cmd_refresh",
        "cmd_rebase",
        "cmd_review",
        "cmd_pin",
        "cmd_check",
        "cmd_models",
        "cmd_publish",
        "cmd_install",
        "cmd_revert",
        "cmd_status",
    ):
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
    parser.add_argument(
        "--root", type=Path, help="the overlay repository (default: nearest folder above with overlays/)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument(
        "-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=0, help="no progress lines"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="store_const",
        const=1,
        help="stream the output of long steps (pip, venvs, builds, compiles) as they run",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in command_modules():
        mod.configure_parser(sub)
    return parser


EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE


def _stdout_closed(*, debug: bool) -> int:
    """The reader of stdout went away (`| head`): like pip, stop quietly; later writes and the exit flush go nowhere."""
    if debug:
        traceback.print_exc()
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no file descriptor (captured): nothing will flush it at exit
        pass
    return EXIT_PIPE_CLOSED


def main(argv: Sequence[str] | None = None) -> int:
    code = _main(argv)
    try:
        sys.stdout.flush()  # here, not at interpreter exit, so a closed pipe is seen and handled
    except BrokenPipeError:
        return _stdout_closed(debug=False)
    return code


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    except BrokenPipeError:  # `overlay --help | head -1`
        return _stdout_closed(debug=False)
    try:
        result: int = args.execute(args)
        return result
    except OverlayError as exc:
        from overlay.cli.output import print_error

        return print_error(exc, debug=args.debug)
    except KeyboardInterrupt:
        # publishing steps (refresh, rebase, checkout, apply) roll back what they had begun when interrupted
        print(
            "ERROR interrupted; every file is either as it was or fully updated (a publish under way is rolled "
            "back; scratch files are removed on the next run)",
            file=sys.stderr,
        )
        print("TIP run the command again", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _stdout_closed(debug=args.debug)
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        print(f"ERROR unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        print("TIP run again with --debug for a traceback, and report it", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
