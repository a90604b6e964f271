"""Edit a manifest's values through a TOML parser (tomlkit), keeping its comments, order and layout.

Values are found by the TOML structure, never by scanning lines, so a multi-line string that happens to hold
``[upstream.artifacts]`` or ``version = "..."`` is data, not a table or a key. A value keeps its trailing comment
when it is replaced; a removed key leaves its reason as a comment on its table's header line; the
``[[upstream.artifacts]]`` tables can be replaced as a whole (a release whose set of files changed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import AoT, Item, Table

from overlay.errors import ConfigError


@dataclass(frozen=True)
class Edit:
    """Set (or with ``value`` None, remove) ``key`` in table ``table``; ``index`` picks the n-th ``[[table]]``.

    ``comment`` says why a removed key went (a comment on the table's header line, so the file keeps the reason).
    """

    table: str
    key: str
    value: str | None
    index: int | None = None
    comment: str | None = None


def toml_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _parse(text: str, where: str) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.TOMLKitError as exc:
        raise ConfigError(
            f"{where}: not valid TOML ({exc})", tip="fix the file by hand, then run the command again"
        ) from None


def _table(doc: tomlkit.TOMLDocument, edit: Edit, where: str) -> Table:
    node: Any = doc
    for part in edit.table.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            raise ConfigError(f"{where}: no table [{edit.table}] to edit {edit.key} in")
    if isinstance(node, AoT):
        if edit.index is None or not 0 <= edit.index < len(node):
            raise ConfigError(
                f"{where}: [[{edit.table}]] has {len(node)} entries; entry {edit.index} does not exist"
            )
        node = node[edit.index]
    elif edit.index is not None:
        raise ConfigError(f"{where}: [{edit.table}] is one table, not an array of tables [[{edit.table}]]")
    if not isinstance(node, Table):
        raise ConfigError(f"{where}: {edit.table} is not a table")
    return node


def _note(table: Table, comment: str) -> None:
    old = table.trivia.comment.removeprefix("#").strip()
    table.comment(f"{old}; {comment}" if old else comment)


def _replace(table: Table, key: str, value: str) -> None:
    new: Item = tomlkit.string(value)
    old = table.get(key)
    if isinstance(old, Item) and old.trivia.comment:
        new.trivia.comment_ws = old.trivia.comment_ws
        new.trivia.comment = old.trivia.comment
    table[key] = new


def apply_edits(text: str, edits: Sequence[Edit], *, where: str) -> str:
    """Return ``text`` with ``edits`` applied. A key that is absent is added at the end of its table."""
    doc = _parse(text, where)
    for edit in edits:
        table = _table(doc, edit, where)
        if edit.value is not None:
            _replace(table, edit.key, edit.value)
        elif edit.key in table:
            del table[edit.key]
            if edit.comment:
                _note(table, edit.comment)
    return tomlkit.dumps(doc)


def replace_tables(
    text: str, table: str, rows: Sequence[dict[str, str]], *, where: str, comment: str = ""
) -> str:
    """Return ``text`` with the array of tables ``[[table]]`` replaced by ``rows`` (in order), e.g. the artifacts
    of a release whose files differ from the pinned one's. ``comment`` goes on the first new table's header."""
    doc = _parse(text, where)
    parent: Any = doc
    *path, leaf = table.split(".")
    for part in path:
        parent = parent.get(part)
        if not isinstance(parent, Table | tomlkit.TOMLDocument):
            raise ConfigError(f"{where}: no table [{'.'.join(path)}] to hold [[{table}]]")
    if not isinstance(parent.get(leaf), AoT):
        raise ConfigError(f"{where}: [[{table}]] is not an array of tables")
    aot = tomlkit.aot()
    for i, row in enumerate(rows):
        t = tomlkit.table()
        for key, value in row.items():
            t[key] = value
        if i == 0 and comment:
            t.comment(comment)
        aot.append(t)
    parent[leaf] = aot
    return tomlkit.dumps(doc)
