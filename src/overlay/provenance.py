"""overlay.json: the provenance of a patched wheel, written into its .dist-info and read back from a wheel file or
an installed distribution."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from overlay import __version__
from overlay.errors import ConfigError, IntegrityError, UsageError
from overlay.manifest import Artifact, Manifest
from overlay.series import Patch, series_hash

PROVENANCE_FILE = "overlay.json"
SCHEMA_VERSION = 1


def local_version(manifest: Manifest, patches: Sequence[Patch]) -> str:
    """``UPSTREAM+LABEL.N.gHASH8`` (DESIGN)."""
    return f"{manifest.upstream.version}+{manifest.series.label}.{len(patches)}.g{series_hash(list(patches))[:8]}"


def build_provenance(
    manifest: Manifest,
    patches: Sequence[Patch],
    *,
    artifact: Artifact | None,
    source: dict[str, Any],
) -> dict[str, Any]:
    return {
        "version": SCHEMA_VERSION,
        "tool": {"name": "overlay", "version": __version__},
        "engine": manifest.name,
        "upstream": {
            "distribution": manifest.distribution,
            "version": manifest.upstream.version,
            "commit": manifest.upstream.commit if source.get("kind") != "git" else source.get("commit"),
            "artifact": None if artifact is None else {"filename": artifact.filename, "sha256": artifact.sha256},
        },
        "source": source,
        "series": {
            "sha256": series_hash(list(patches)),
            "patches": [
                {
                    "name": p.name,
                    "sha256": p.sha256,
                    "subject": p.subject,
                    "theme": p.theme,
                    "numerics": p.numerics,
                    "upstream_status": p.upstream_status,
                }
                for p in patches
            ],
        },
    }


def dumps(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n").encode("utf-8")


@dataclass(frozen=True)
class Provenance:
    data: dict[str, Any]
    where: str  # wheel path or "installed: <dist> at <location>"

    @property
    def engine(self) -> str:
        return str(self.data.get("engine"))


def validate(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("version") != SCHEMA_VERSION:
        raise IntegrityError(f"{where}: overlay.json is not provenance schema version {SCHEMA_VERSION}")
    for key in ("tool", "engine", "upstream", "series"):
        if key not in data:
            raise IntegrityError(f"{where}: overlay.json lacks {key!r}")
    return data


def read_from_wheel(path: Path) -> Provenance:
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith(f".dist-info/{PROVENANCE_FILE}") and n.count("/") == 1]
            if not names:
                raise UsageError(
                    f"{path.name} has no .dist-info/{PROVENANCE_FILE}: it is not a wheel built by overlay",
                    tip="build one with `overlay apply ENGINE`",
                )
            data = json.loads(zf.read(names[0]))
    except zipfile.BadZipFile as exc:
        raise IntegrityError(f"{path} is not a readable wheel: {exc}") from None
    return Provenance(data=validate(data, str(path)), where=str(path))


def read_from_installed(distribution: str, *, path: Sequence[str] | None = None) -> Provenance:
    try:
        if path is None:
            dist = importlib_metadata.distribution(distribution)
        else:
            found = list(importlib_metadata.distributions(name=distribution, path=list(path)))
            if not found:
                raise importlib_metadata.PackageNotFoundError(distribution)
            dist = found[0]
    except importlib_metadata.PackageNotFoundError:
        raise UsageError(
            f"no installed distribution named {distribution!r} and no such wheel file",
            tip="pass a .whl path, or the name of a distribution installed in this Python",
        ) from None
    text = dist.read_text(PROVENANCE_FILE)
    if text is None:
        raise UsageError(
            f"{distribution} {dist.version} is installed but carries no {PROVENANCE_FILE}: it is the stock distribution",
            tip="install a wheel built by `overlay apply`",
        )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"installed {distribution}: {PROVENANCE_FILE} is not JSON: {exc}") from None
    location = getattr(dist, "_path", "?")
    return Provenance(data=validate(data, f"installed {distribution}"), where=f"installed: {distribution} {dist.version} ({location})")


def summary_lines(prov: Provenance) -> list[str]:
    d = prov.data
    up = d["upstream"]
    art = up.get("artifact") or {}
    lines = [
        f"engine:   {d['engine']}",
        f"upstream: {up['distribution']} {up['version']}"
        + (f" (commit {up['commit']})" if up.get("commit") else ""),
    ]
    if art:
        lines.append(f"artifact: {art.get('filename')} sha256={art.get('sha256')}")
    src = d.get("source") or {}
    if src:
        lines.append("source:   " + ", ".join(f"{k}={v}" for k, v in src.items()))
    lines.append(f"series:   {len(d['series']['patches'])} patches, sha256={d['series']['sha256']}")
    for p in d["series"]["patches"]:
        lines.append(f"  {p['name']}  [{p.get('theme')}/{p.get('numerics')}]  {p.get('subject')}")
    lines.append(f"tool:     {d['tool']['name']} {d['tool']['version']}")
    return lines
