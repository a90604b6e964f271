"""The data a series is made of: lines, hunks, file diffs, patches (kept as their bytes) and the series."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from overlay.core.mechanism import Flag, Mechanism


THEMES = (
    "cuda-graph",
    "h2d-sync",
    "allreduce-fusion",
    "sampling-fusion",
    "lm-head",
    "kernel-injection",
    "drafter-kv",
    "mtp",
    "spec-decoding",
    "dispatch-fusion",
    "loading",
    "platform",
    "observability",
    "other",
)


NUMERICS = ("exact", "lossless", "approximate")


UPSTREAM_STATUS = ("Pending", "Submitted", "Backport", "Inappropriate")


REQUIRED_TRAILERS = ("Overlay-Theme", "Overlay-Numerics", "Overlay-Check", "Upstream-Status")


Numerics = Literal["exact", "lossless", "approximate"]


FileKind = Literal["modify", "add", "delete", "rename", "copy"]


_PATCH_NAME = re.compile(r"^(\d{4})-[A-Za-z0-9][A-Za-z0-9._-]*\.patch$")


@dataclass(frozen=True)
class Line:
    """One hunk line: ``op`` is ' ', '-' or '+'; ``text`` includes the line ending unless ``eol`` is False."""

    op: str
    text: bytes


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str
    lines: tuple[Line, ...]
    header_line: int  # 1-based line of the @@ header in the patch file

    @property
    def old_lines(self) -> tuple[bytes, ...]:
        return tuple(line.text for line in self.lines if line.op != "+")

    @property
    def new_lines(self) -> tuple[bytes, ...]:
        return tuple(line.text for line in self.lines if line.op != "-")


@dataclass(frozen=True)
class FileDiff:
    kind: FileKind
    old_path: str | None  # repo-root relative, None for a new file
    new_path: str | None  # None for a deleted file
    old_mode: str | None
    new_mode: str | None
    old_blob: str | None
    new_blob: str | None
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        """The path this diff leaves behind (or removes)."""
        return self.new_path if self.new_path is not None else (self.old_path or "")

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in dict.fromkeys((self.old_path, self.new_path)) if p is not None)


@dataclass(frozen=True)
class Patch:
    name: str
    raw: bytes
    author: str
    date: str
    subject: str
    body: str  # message after the subject, trailers included
    trailers: tuple[tuple[str, str], ...]
    files: tuple[FileDiff, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def number(self) -> int:
        m = _PATCH_NAME.match(self.name)
        return int(m.group(1)) if m else 0

    def trailer(self, key: str) -> str | None:
        for k, v in self.trailers:
            if k.lower() == key.lower():
                return v
        return None

    @property
    def theme(self) -> str | None:
        return self.trailer("Overlay-Theme")

    @property
    def numerics(self) -> str | None:
        return self.trailer("Overlay-Numerics")

    @property
    def check(self) -> str | None:
        return self.trailer("Overlay-Check")

    @property
    def upstream_status(self) -> str | None:
        return self.trailer("Upstream-Status")

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for f in self.files for p in f.paths))

    def trailer_values(self, key: str) -> tuple[str, ...]:
        """Every value of a trailer that may repeat (``Overlay-Mechanism``, ``Overlay-Requires``), in message order."""
        return tuple(v for k, v in self.trailers if k.lower() == key.lower())

    @property
    def flags(self) -> tuple[Flag, ...]:
        """The parsed ``Overlay-Flag`` values (raises ConfigError on a malformed one; `overlay lint` reports it)."""
        from overlay.core.mechanism import parse_flag

        return tuple(parse_flag(v) for v in self.trailer_values("Overlay-Flag"))

    @property
    def mechanisms(self) -> tuple[Mechanism, ...]:
        """The parsed ``Overlay-Mechanism`` lines (scenario names checked against every engine's census)."""
        from overlay.core.mechanism import parse_mechanism

        return tuple(parse_mechanism(v) for v in self.trailer_values("Overlay-Mechanism"))

    @property
    def requires(self) -> tuple[str, ...]:
        """The patch file names ``Overlay-Requires`` lists (earlier patches of the same series)."""
        return tuple(name for v in self.trailer_values("Overlay-Requires") for name in v.split())


@dataclass(frozen=True)
class Series:
    engine: str
    base_version: str
    base_commit: str | None
    patches: tuple[Patch, ...]
    path: Path

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.patches)

    def prefix(self, upto: int | None) -> tuple[Patch, ...]:
        return self.patches if upto is None else self.patches[:upto]


def series_hash(patches: tuple[Patch, ...] | list[Patch]) -> str:
    """sha256 over the applied patch files' bytes, concatenated in series order (DESIGN: HASH8 = first 8 hex)."""
    digest = hashlib.sha256()
    for patch in patches:
        digest.update(patch.raw)
    return digest.hexdigest()


def check_trailers(patch: Patch) -> list[str]:
    """Problems with a patch's metadata trailers (empty list when valid)."""
    problems: list[str] = []
    keys = {k.lower(): (k, v) for k, v in patch.trailers}
    for req in REQUIRED_TRAILERS:
        if req.lower() not in keys:
            problems.append(f"missing trailer {req}:")
    theme = patch.theme
    if theme is not None and theme not in THEMES:
        problems.append(f"Overlay-Theme {theme!r} is not one of {', '.join(THEMES)}")
    numerics = patch.numerics
    if numerics is not None and numerics not in NUMERICS:
        problems.append(f"Overlay-Numerics {numerics!r} is not one of {', '.join(NUMERICS)}")
    status = patch.upstream_status
    if status is not None:
        word, _, rest = status.partition(" ")
        if word not in UPSTREAM_STATUS:
            problems.append(f"Upstream-Status {status!r} must start with one of {', '.join(UPSTREAM_STATUS)}")
        elif word in ("Submitted", "Backport") and not rest.strip():
            problems.append(f"Upstream-Status {word} needs a URL (e.g. `{word} https://github.com/...`)")
        elif word == "Inappropriate" and not rest.strip():
            problems.append("Upstream-Status Inappropriate needs a reason")
    check = patch.check
    if check is not None and not check.strip():
        problems.append("Overlay-Check is empty")
    if not patch.body.strip() or len([line for line in patch.body.splitlines() if line.strip()]) <= len(
        patch.trailers
    ):
        problems.append("the message has no body: say what changes, why, and what was measured")
    return problems
