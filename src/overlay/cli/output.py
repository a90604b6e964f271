"""How the CLI shows things: step lines on stderr (stable prefixes), results on stdout, JSON when asked."""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from typing import Any, TextIO

from overlay.errors import OverlayError
from overlay.progress import Stage


class StepReporter:
    """Prints ``stage: message`` lines to stderr; quiet mode shows nothing, verbose mode shows advance ticks.

    Long steps (:func:`overlay.proc.run_step`) get a start line and a ``done in N s`` line; on a terminal the start
    line counts the seconds while the step runs; with ``-v`` every output line of the command is shown, indented.
    Without a terminal the lines are plain and stable (no carriage returns), for logs and tests.
    """

    def __init__(self, *, verbosity: int = 0, stream: TextIO | None = None) -> None:
        self.verbosity = verbosity
        self.stream = stream
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def _out(self) -> TextIO:
        return self.stream or sys.stderr

    def _tty(self) -> bool:
        isatty = getattr(self._out(), "isatty", None)
        return bool(isatty and isatty()) and self.verbosity == 0

    def step(self, stage: Stage, message: str) -> None:
        if self.verbosity >= 0:
            with self._lock:
                print(f"{stage}: {message}", file=self._out(), flush=True)

    def advance(self, stage: Stage, done: int, total: int) -> None:
        if self.verbosity > 0:
            print(f"{stage}: {done}/{total}", file=self._out(), flush=True)

    def begin(self, stage: Stage, message: str) -> None:
        if self.verbosity < 0:
            return
        if not self._tty():
            self.step(stage, message)
            return
        self._stop.clear()
        start = time.monotonic()

        def tick() -> None:
            while not self._stop.wait(1.0):
                with self._lock:
                    self._out().write(f"\r{stage}: {message} ({time.monotonic() - start:.0f} s)")
                    self._out().flush()

        self._out().write(f"{stage}: {message}")
        self._out().flush()
        self._ticker = threading.Thread(target=tick, daemon=True)
        self._ticker.start()

    def output(self, stage: Stage, line: str) -> None:
        if self.verbosity > 0:
            with self._lock:
                print(f"  | {line}", file=self._out(), flush=True)

    def end(self, stage: Stage, message: str, *, seconds: float, returncode: int) -> None:
        if self.verbosity < 0:
            return
        outcome = (
            f"done in {seconds:.1f} s"
            if returncode == 0
            else f"failed (exit {returncode}) after {seconds:.1f} s"
        )
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
            with self._lock:
                print(f"\r{stage}: {message}: {outcome}", file=self._out(), flush=True)
            return
        self.step(stage, f"{message}: {outcome}")


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
