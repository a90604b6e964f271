"""Edit values of a manifest in place, keeping its comments, order and layout (no TOML re-serialisation).

Only single-line basic-string values are edited (``key = "value"  # comment``); anything else is refused, so a
reviewer's diff of a re-pinned manifest shows exactly the changed values.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from overlay.errors import ConfigError

_TABLE = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?\s*(#.*)?$")
_KEYVAL = re.compile(r'^(?P<indent>\s*)(?P<key>[A-Za-z0-9_-]+)(?P<eq>\s*=\s*)(?P<value>"(?:[^"\\]|\\.)*")(?P<rest>\s*(#.*)?)$')
_ANYKEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")


@dataclass(frozen=True)
class Edit:
    """Set (or with ``value`` None, remove) ``key`` in table ``table``; ``index`` picks the n-th ``[[table]]``.

    ``comment`` replaces a removed line (a ``# ...`` line in its place), so the file says why the key went.
    """

    table: str
    key: str
    value: str | None
    index: int | None = None
    comment: str | None = None


def toml_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def apply_edits(text: str, edits: list[Edit], *, where: str) -> str:
    """Return ``text`` with ``edits`` applied. A key that is absent is added after the last key of its table."""
    lines = text.splitlines(keepends=True)
    table = ""
    idx: int | None = None
    counts: dict[str, int] = {}
    pending = {(e.table, e.index, e.key): e for e in edits}
    out: list[str] = []
    last_key: dict[tuple[str, int | None], int] = {}  # (table, index) -> position in out after its last key line
    for lineno, line in enumerate(lines, start=1):
        m = _TABLE.match(line)
        if m:
            table = m.group(2)
            if m.group(1) == "[[":
                counts[table] = counts.get(table, -1) + 1
                idx = counts[table]
            else:
                idx = None
            out.append(line)
            last_key[(table, idx)] = len(out)
            continue
        km = _ANYKEY.match(line)
        if km:
            edit = pending.pop((table, idx, km.group(1)), None)
            if edit is not None:
                kv = _KEYVAL.match(line.rstrip("\r\n"))
                if kv is None:
                    raise ConfigError(
                        f"{where}:{lineno}: cannot edit {table}.{edit.key} in place: its value is not a one-line string",
                        tip='write it as key = "value" on one line',
                    )
                eol = line[len(line.rstrip("\r\n")) :]
                if edit.value is None:
                    if edit.comment:
                        out.append(f"{kv.group('indent')}# {edit.comment}{eol}")
                else:
                    out.append(
                        f"{kv.group('indent')}{kv.group('key')}{kv.group('eq')}{toml_string(edit.value)}{kv.group('rest')}{eol}"
                    )
                last_key[(table, idx)] = len(out)
                continue
            out.append(line)
            last_key[(table, idx)] = len(out)
            continue
        out.append(line)
    inserts: list[tuple[int, str]] = []
    for e in pending.values():
        if e.value is None:
            continue
        pos = last_key.get((e.table, e.index))
        if pos is None:
            raise ConfigError(f"{where}: no table [{e.table}] to add {e.key} to")
        inserts.append((pos, f"{e.key} = {toml_string(e.value)}\n"))
    for pos, line in sorted(inserts, reverse=True):
        out.insert(pos, line)
    return "".join(out)
