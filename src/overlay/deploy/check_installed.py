"""Standalone check (standard library only) that `overlay publish` copies into the index as check_installed.py.

An image build runs it after installing from the index (docs/deploy.md)::

    python /opt/overlay-index/check_installed.py

It reads overlay-index.json beside it and exits 1, naming what differs, unless the interpreter running it has the
published patched version installed, its overlay.json names the published series, every installed file matches
RECORD, and ``import NAME`` resolves to those installed files (no source checkout or PYTHONPATH entry shadows them,
and the working directory, which ``python -m`` puts first on sys.path, holds no folder of that name).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import importlib.util
import json
import sys
from pathlib import Path


def problems(index: dict[str, object]) -> list[str]:
    project, want = str(index["project"]), str(index["wheel_version"])
    try:
        dist = md.distribution(project)
    except md.PackageNotFoundError:
        return [f"{project} is not installed"]
    found: list[str] = []
    if dist.version != want:
        found.append(
            f"{project} {dist.version} is installed, not {want} (a stock install kept as 'already "
            "satisfied'? install with --force-reinstall)"
        )
    text = dist.read_text("overlay.json")
    if text is None:
        return found + [f"{project} {dist.version} carries no overlay.json: it is the stock distribution"]
    series = json.loads(text).get("series") or {}
    if series.get("sha256") != index.get("series_sha256"):
        found.append(
            f"overlay.json names series {series.get('sha256')}, the index {index.get('series_sha256')}"
        )
    for entry in dist.files or []:
        if entry.hash is None:
            continue
        try:
            data = Path(str(dist.locate_file(entry))).read_bytes()
        except OSError:
            found.append(f"{entry} is in RECORD but missing")
            continue
        digest = base64.urlsafe_b64encode(hashlib.new(entry.hash.mode, data).digest()).rstrip(b"=").decode()
        if digest != entry.hash.value.rstrip("="):
            found.append(f"{entry} differs from RECORD")
    name = str(index["import_name"])
    spec = importlib.util.find_spec(name)
    origin = (
        None if spec is None else (spec.origin or next(iter(spec.submodule_search_locations or []), None))
    )
    location = Path(str(dist.locate_file(""))).resolve()
    if origin is None or not Path(origin).resolve().is_relative_to(location):
        found.append(f"import {name} resolves to {origin}, not to the installed files in {location}")
    here = Path.cwd() / name
    if here.exists() and not here.resolve().is_relative_to(location):
        found.append(
            f"the working directory holds {here}: `python -m {name}...` run from here imports that folder, "
            "not the wheel (set WORKDIR elsewhere)"
        )
    return found


def main() -> int:
    index = json.loads((Path(__file__).resolve().parent / "overlay-index.json").read_text(encoding="utf-8"))
    found = problems(index)
    for line in found:
        print(f"check_installed: {line}", file=sys.stderr)
    if not found:
        print(
            f"check_installed: {index['project']} {index['wheel_version']} installed, overlay.json and every file "
            "match, import resolves to the wheel"
        )
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
