"""Long external commands (venv creation, pip installs and downloads, wheel builds, compiles, model training) run as
one reported step: the reporter sees when it starts and how long it took, and, when it streams (``overlay -v``),
every output line as it comes. Output is captured either way, for error messages. git has its own runner
(:mod:`overlay.git.ops`: hermetic environment, no streaming).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from overlay.progress import Reporter, Stage


@runtime_checkable
class LiveReporter(Protocol):
    """A reporter that shows long steps as they run (the CLI's on a terminal, or with ``-v``)."""

    def begin(self, stage: Stage, message: str) -> None: ...

    def output(self, stage: Stage, line: str) -> None: ...

    def end(self, stage: Stage, message: str, *, seconds: float, returncode: int) -> None: ...


def _pump(stream: IO[str], sink: list[str], stage: Stage, live: LiveReporter | None) -> None:
    for line in stream:
        sink.append(line)
        if live is not None:
            live.output(stage, line.rstrip("\n"))


def run_step(
    cmd: Sequence[str],
    *,
    reporter: Reporter,
    stage: Stage,
    what: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (text mode, never raising on a non-zero exit) as the step ``what``; stdout and stderr are captured
    separately and returned. ``subprocess.TimeoutExpired`` is raised after killing the command, like
    ``subprocess.run``."""
    live = reporter if isinstance(reporter, LiveReporter) else None
    if live is not None:
        live.begin(stage, what)
    else:
        reporter.step(stage, what)
    start = time.monotonic()
    out: list[str] = []
    err: list[str] = []
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=None if env is None else dict(env),
        text=True,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, out, stage, live), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, err, stage, live), daemon=True),
    ]
    for t in pumps:
        t.start()
    try:
        if input is not None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(input)
                proc.stdin.close()
            except BrokenPipeError:  # the command exited without reading all of it: its exit code says why
                pass
        returncode = proc.wait(timeout=timeout)
    except BaseException:  # a timeout or Ctrl-C: the command must not outlive us
        proc.kill()
        proc.wait()
        raise
    finally:
        for t in pumps:
            t.join()
    if live is not None:
        live.end(stage, what, seconds=time.monotonic() - start, returncode=returncode)
    return subprocess.CompletedProcess(list(cmd), returncode, "".join(out), "".join(err))
