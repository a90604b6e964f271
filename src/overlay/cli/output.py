"""How the CLI shows things: step lines on stderr (stable prefixes), results on stdout, JSON when asked."""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any, TextIO

from overlay.errors import OverlayError
from overlay.progress import Stage


class StepReporter:
    """Prints ``stage: message`` lines to stderr; quiet mode shows nothing, verbose mode shows advance ticks."""

    def __init__(self, *, verbosity: int = 0, stream: TextIO | None = None) -> None:
        self.verbosity = verbosity
        self.stream = stream

    def _out(self) -> TextIO:
        return self.stream or sys.stderr

    def step(self, stage: Stage, message: str) -> None:
        if self.verbosity >= 0:
            print(f"{stage}: {message}", file=self._out(), flush=True)

    def advance(self, stage: Stage, done: int, total: int) -> None:
        if self.verbosity > 0:
            print(f"{stage}: {done}/{total}", file=self._out(), flush=True)


def emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def print_error(exc: OverlayError, *, debug: bool) -> int:
    """``ERROR message`` and ``TIP tip`` on stderr (a traceback with --debug); returns the error's exit code."""
    if debug:
        traceback.print_exc()
    print(f"ERROR {exc.message}", file=sys.stderr)
    if exc.tip:
        print(f"TIP {exc.tip}", file=sys.stderr)
    return exc.return_code


def reporter_for(args: Any) -> StepReporter:
    return StepReporter(verbosity=getattr(args, "verbosity", 0))
