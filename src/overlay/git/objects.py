"""Git object ids computed in Python (no git process): the tree id a set of files would get when committed.

Used to check that a worktree's base commit really is the pinned artifact's tree (``refresh``, ``rebase``) without
writing the tree into a repository first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

FILE_MODE = b"100644"
EXEC_MODE = b"100755"
DIR_MODE = b"40000"


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def tree_id(files: Mapping[str, bytes], *, executable: Iterable[str] = ()) -> str:
    """The id of the git tree holding ``files`` ({posix path: bytes}); modes 100644, or 100755 for ``executable``."""
    exe = set(executable)
    root: dict[str, object] = {}
    for path, data in files.items():
        parts = path.split("/")
        node = root
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            assert isinstance(child, dict), f"{path}: a file and a folder share the name {part!r}"
            node = child
        node[parts[-1]] = (EXEC_MODE if path in exe else FILE_MODE, bytes.fromhex(blob_id(data)))
    return _write(root).hex()


def _write(node: dict[str, object]) -> bytes:
    entries: list[tuple[bytes, bytes, bytes]] = []  # (sort key, mode, name) + id appended below
    ids: dict[bytes, bytes] = {}
    for name, value in node.items():
        raw = name.encode("utf-8")
        if isinstance(value, dict):
            ids[raw] = _write(value)
            entries.append((raw + b"/", DIR_MODE, raw))
        else:
            assert isinstance(value, tuple)
            mode, oid = value
            ids[raw] = oid
            entries.append((raw, mode, raw))
    body = b"".join(mode + b" " + raw + b"\0" + ids[raw] for _key, mode, raw in sorted(entries))
    return hashlib.sha1(b"tree %d\0" % len(body) + body, usedforsecurity=False).digest()
