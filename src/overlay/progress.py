"""Progress reporting from the core without printing: the core calls a Reporter, the CLI decides how to show it.

Step lines have stable prefixes (the stage names below), so logs can be grepped and tests can read them.
"""

from __future__ import annotations

from typing import Literal, Protocol

Stage = Literal[
    "fetch",
    "unpack",
    "apply",
    "build",
    "wheel",
    "lint",
    "git",
    "env",
    "rebase",
    "review",
    "check",
    "model",
    "lock",
]


class Reporter(Protocol):
    def step(self, stage: Stage, message: str) -> None:
        """One line of progress: ``stage`` is a stable prefix, ``message`` free text."""

    def advance(self, stage: Stage, done: int, total: int) -> None:
        """Progress within a step (bytes or items)."""


class NullReporter:
    def step(self, stage: Stage, message: str) -> None:
        pass

    def advance(self, stage: Stage, done: int, total: int) -> None:
        pass


class ListReporter:
    """Collects step lines; handy in tests."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, stage: Stage, message: str) -> None:
        self.lines.append(f"{stage}: {message}")

    def advance(self, stage: Stage, done: int, total: int) -> None:
        pass
