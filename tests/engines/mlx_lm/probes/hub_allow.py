"""Probe: which files of a Hub repo ``mlx_lm.utils._download`` asks for, through huggingface_hub's real snapshot code.

Payload: {"cache": folder, "files": {name: text}, "omit": [names]}. Builds a local Hub cache for the repo
``overlay-test/tiny-mtp`` (refs/main, one snapshot holding every file but ``omit``, and the tree listing of the
commit with all of them, as huggingface_hub writes it after a download), then calls ``_download`` on the repo id with
``HF_HUB_OFFLINE=1`` (no network). huggingface_hub then checks the snapshot against the listing filtered by the
allow patterns mlx-lm passes: a requested file that is missing raises ``IncompleteSnapshotError``.
Result: {"allowed": [files of the listing the patterns keep], "download": path | null, "error": "Type: message" | null}.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from probe_io import emit, read_payload

REPO = "overlay-test/tiny-mtp"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

if __name__ == "__main__":
    payload = read_payload()
    cache = Path(payload["cache"])
    os.environ["HF_HUB_CACHE"] = str(cache)
    os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache
    from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]
    from mlx_lm import utils

    storage = cache / ("models--" + REPO.replace("/", "--"))
    snap = storage / "snapshots" / COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(COMMIT)
    entries = {}
    for name, text in payload["files"].items():
        data = text.encode()
        entries[name] = TreeCacheEntry(size=len(data), blob_id=hashlib.sha1(data).hexdigest())
        if name not in payload.get("omit", []):
            (snap / name).write_bytes(data)
    write_tree_cache(str(storage), COMMIT, entries)
    allowed = sorted(filter_repo_objects(items=list(entries), allow_patterns=utils.DEFAULT_ALLOW_PATTERNS))
    path: str | None
    error: str | None
    try:
        path, error = str(utils._download(REPO)), None
    except Exception as exc:
        path, error = None, f"{type(exc).__name__}: {exc}"
    print(error, file=sys.stderr)
    emit({"allowed": allowed, "download": path, "error": error})
