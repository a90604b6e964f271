"""Long steps: elapsed time reported, -v streams the command's output, plain stable lines without a terminal."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from overlay.cli.output import StepReporter
from overlay.proc import run_step
from overlay.progress import ListReporter

SCRIPT = "import sys; print('out 1'); print('err 1', file=sys.stderr); print('out 2'); sys.exit(3)"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_reporter_gets_one_step_line_and_the_captured_output() -> None:
    rep = ListReporter()
    proc = run_step([sys.executable, "-c", SCRIPT], reporter=rep, stage="env", what="a long step")
    assert rep.lines == ["env: a long step"]
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out 1\nout 2\n", "err 1\n")


def test_cli_reporter_without_a_terminal_writes_stable_lines() -> None:
    buf = io.StringIO()
    run_step([sys.executable, "-c", SCRIPT], reporter=StepReporter(stream=buf), stage="build", what="compile")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "build: compile"
    assert lines[1].startswith("build: compile: failed (exit 3) after ") and lines[1].endswith(" s")
    assert "\r" not in buf.getvalue() and len(lines) == 2


def test_verbose_streams_every_output_line() -> None:
    buf = io.StringIO()
    run_step(
        [sys.executable, "-c", SCRIPT.replace("sys.exit(3)", "pass")],
        reporter=StepReporter(verbosity=1, stream=buf),
        stage="env",
        what="pip install",
    )
    text = buf.getvalue()
    for line in ("  | out 1", "  | out 2", "  | err 1"):
        assert line in text.splitlines()
    assert text.splitlines()[-1].startswith("env: pip install: done in ")


def test_quiet_shows_nothing() -> None:
    buf = io.StringIO()
    run_step(
        [sys.executable, "-c", "print(1)"],
        reporter=StepReporter(verbosity=-1, stream=buf),
        stage="env",
        what="x",
    )
    assert buf.getvalue() == ""


def test_terminal_counts_seconds_while_the_step_runs() -> None:
    buf = _Tty()
    run_step(
        [sys.executable, "-c", "import time; time.sleep(2.3)"],
        reporter=StepReporter(stream=buf),
        stage="env",
        what="creating the venv",
    )
    text = buf.getvalue()
    assert text.startswith("env: creating the venv")
    assert "\renv: creating the venv (1 s)" in text and "\renv: creating the venv (2 s)" in text
    assert text.endswith(" s\n") and "creating the venv: done in 2." in text


def test_a_timeout_kills_the_command() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_step(
            [sys.executable, "-c", "import time; time.sleep(30)"],
            reporter=ListReporter(),
            stage="env",
            what="sleep",
            timeout=0.5,
        )
