"""One error hierarchy, caught once by the CLI.

Every error carries the exit code of its class and a message that says what failed, the offending value and the
next step (a flag or a command). The CLI prints ``ERROR <message>`` (and ``TIP <tip>`` when given) and returns the
code; tracebacks only with ``--debug``.

Exit codes (DESIGN): 0 success; 1 unexpected; 2 usage or configuration; 3 a patch does not apply or a rebase
stopped on a conflict; 4 a check failed; 5 integrity (hash mismatch, corrupt archive, unsafe path).
"""

from __future__ import annotations


class OverlayError(Exception):
    """Base class: every failure the tool expects and explains."""

    return_code: int = 1

    def __init__(self, message: str, *, tip: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.tip = tip

    def __str__(self) -> str:
        return self.message


class UsageError(OverlayError):
    """Wrong arguments or a state the command refuses to work from."""

    return_code = 2


class ConfigError(OverlayError):
    """A manifest, series or patch file that does not validate."""

    return_code = 2


class PatchError(OverlayError):
    """A patch does not apply exactly at the pinned base."""

    return_code = 3


class ConflictError(OverlayError):
    """A rebase stopped on a conflict the user has to resolve."""

    return_code = 3


class CheckFailed(OverlayError):
    """A check gate failed (outputs differ beyond the patch's numerics class, or a speed gate)."""

    return_code = 4


class IntegrityError(OverlayError):
    """A hash mismatch, a corrupt archive or a path that escapes the tree."""

    return_code = 5


class ExternalCommandError(OverlayError):
    """A tool we run (pip, git, python -m build) failed."""

    return_code = 1
