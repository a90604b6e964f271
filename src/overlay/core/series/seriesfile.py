"""The series file (``patches/ENGINE/series``): one reader, one writer (comments and blank lines kept), and the
series folder loaded against it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from overlay.core.inputs import check_name, decode_utf8, inside_root, read_inside
from overlay.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from overlay.core.manifest import Manifest

from overlay.core.series.model import _PATCH_NAME, Series
from overlay.core.series.parse import parse_patch


@dataclass(frozen=True)
class SeriesFile:
    engine: str
    base_version: str
    base_commit: str | None
    names: tuple[str, ...]


def parse_series_file(path: Path, *, root: Path | None = None) -> SeriesFile:
    """Parse a ``series`` file, read without following a symlink out of ``root`` (default: its folder)."""
    try:
        data = read_inside(path.parent if root is None else root, path, what="series file")
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist", tip="create it with `# base: ENGINE VERSION COMMIT` as its first line"
        ) from None
    text = decode_utf8(data, path, tip="patch file names are ASCII; save series as UTF-8")
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# base:"):
        raise ConfigError(
            f"{path}:1: the first line must be `# base: ENGINE VERSION COMMIT`, got {lines[:1]!r}"
        )
    fields = lines[0][len("# base:") :].split()
    if len(fields) != 3:
        raise ConfigError(
            f"{path}:1: `# base:` needs ENGINE VERSION COMMIT (COMMIT may be '-'), got {fields!r}"
        )
    engine, version, commit = fields
    if commit != "-" and not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ConfigError(f"{path}:1: base commit {commit!r} is neither '-' nor a 40-hex commit id")
    names: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if " " in entry or "\t" in entry:
            raise ConfigError(
                f"{path}:{lineno}: one patch file name per line, got {entry!r} (options are not supported)"
            )
        check_name(entry, what="patch name", where=f"{path}:{lineno}")
        if not _PATCH_NAME.match(entry):
            raise ConfigError(
                f"{path}:{lineno}: {entry!r} is not a patch file name of the form NNNN-slug.patch"
            )
        if entry in seen:
            raise ConfigError(f"{path}:{lineno}: {entry!r} is listed twice (first on line {seen[entry]})")
        seen[entry] = lineno
        names.append(entry)
    return SeriesFile(
        engine=engine, base_version=version, base_commit=None if commit == "-" else commit, names=tuple(names)
    )


def load_series(series_dir: Path, *, check_folder: bool = True, root: Path | None = None) -> Series:
    """Parse ``series`` and every patch it names; with ``check_folder``, refuse patch files it does not name.

    The folder, ``series`` and every patch file must resolve inside ``root`` (default: the folder itself): a symlink
    that leads out is refused with IntegrityError (:mod:`overlay.core.inputs`).
    """
    root = series_dir if root is None else root
    inside_root(root, series_dir, what="series folder")
    sf = parse_series_file(series_dir / "series", root=root)
    if check_folder:
        on_disk = {p.name for p in series_dir.glob("*.patch")}
        missing = [n for n in sf.names if n not in on_disk]
        if missing:
            raise ConfigError(
                f"{series_dir}/series names {missing[0]!r}, but there is no such file"
                + (f" ({len(missing)} missing)" if len(missing) > 1 else ""),
                tip="restore the file or remove its line from series",
            )
        extra = sorted(on_disk - set(sf.names))
        if extra:
            raise ConfigError(
                f"{series_dir}/{extra[0]} is not listed in series"
                + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""),
                tip="add it to series in its place, or delete it",
            )
        numbers: dict[str, str] = {}
        for n in sf.names:
            num = n[:4]
            if num in numbers:
                raise ConfigError(
                    f"{series_dir}: {n!r} and {numbers[num]!r} share the number {num}",
                    tip="run `overlay refresh` to renumber",
                )
            numbers[num] = n
    patches = tuple(parse_patch(series_dir / n, root=root) for n in sf.names)
    return Series(
        engine=sf.engine,
        base_version=sf.base_version,
        base_commit=sf.base_commit,
        patches=patches,
        path=series_dir,
    )


def slugify(subject: str, *, limit: int = 52) -> str:
    """git format-patch's file-name slug of a subject line."""
    out = []
    prev_dash = True
    for ch in subject:
        if ch.isascii() and (ch.isalnum() or ch in "_."):
            out.append(ch)
            prev_dash = False
        elif not prev_dash:
            out.append("-")
            prev_dash = True
    slug = "".join(out).strip("-.")
    while ".." in slug:
        slug = slug.replace("..", ".")
    return slug[:limit].rstrip("-.") or "patch"


def render_series(
    old_text: str, *, header: str, names: Sequence[str], previous: Mapping[str, str] | None = None
) -> str:
    """The ``series`` file listing ``names`` under ``header``, keeping every comment and blank line of ``old_text``.

    A run of comment and blank lines belongs to the entry after it and travels with that entry when patches are
    renumbered or reordered; an entry's own trailing ``# comment`` stays on its line. Comments of an entry that is
    gone stay where it was (before the next entry that is kept); those after the last entry stay at the end.
    ``previous`` says which old entry each new name continues (new -> old); without it a name continues the old
    entry of the same name, else the one with the same slug (the name without its ``NNNN-`` number).
    """
    lines = old_text.splitlines()[1:]
    blocks: list[
        tuple[list[str], str, str]
    ] = []  # (comment lines before, entry name, the entry's trailing text)
    pending: list[str] = []
    for line in lines:
        entry, sep, rest = line.partition("#")
        name = entry.strip()
        if not name:
            pending.append(line)
            continue
        blocks.append((pending, name, (entry[len(entry.rstrip()) :] + sep + rest) if sep else ""))
        pending = []
    tail = pending
    by_name = {name: i for i, (_c, name, _t) in enumerate(blocks)}
    by_slug: dict[str, int] = {}
    for i, (_c, name, _t) in enumerate(blocks):
        by_slug.setdefault(name[5:], i)
    used: dict[int, str] = {}
    for new in names:
        old = (previous or {}).get(new)
        k = by_name.get(old) if old is not None else None
        if k is None:
            k = by_name.get(new)
        if k is None or k in used:
            k = by_slug.get(new[5:])
        if k is not None and k not in used:
            used[k] = new
    owner = {new: i for i, new in used.items()}
    orphans: list[str] = []  # comments of dropped entries, emitted before the next kept entry in old order
    carried: dict[int, list[str]] = {}
    for i, (comments, _name, _t) in enumerate(blocks):
        if i in used:
            carried[i] = orphans + comments
            orphans = []
        else:
            orphans += comments
    out = [header]
    for new in names:
        at = owner.get(new)
        if at is None:
            out.append(new)
            continue
        out += carried[at]
        out.append(new + blocks[at][2])
    out += orphans + tail
    while len(out) > 1 and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"


def load_engine_series(root: Path, manifest: Manifest, *, check_folder: bool = True) -> Series:
    """The engine's series, checked against the manifest's pin (the `# base:` line must name it)."""
    series_dir = manifest.series_dir(root)
    if not (series_dir / "series").is_file():
        raise ConfigError(
            f"{series_dir.relative_to(root) if series_dir.is_relative_to(root) else series_dir}/series does not exist",
            tip=f"create it: first line `# base: {manifest.name} {manifest.upstream.version} {manifest.upstream.commit or '-'}`",
        )
    series = load_series(series_dir, check_folder=check_folder, root=root)
    if series.engine != manifest.name or series.base_version != manifest.upstream.version:
        raise ConfigError(
            f"{series_dir}/series is based on {series.engine} {series.base_version}, but {manifest.path.name} pins "
            f"{manifest.name} {manifest.upstream.version}",
            tip="rebase the series (`overlay rebase`) or fix the `# base:` line",
        )
    if series.base_commit and manifest.upstream.commit and series.base_commit != manifest.upstream.commit:
        raise ConfigError(
            f"{series_dir}/series is based on commit {series.base_commit}, the manifest pins {manifest.upstream.commit}"
        )
    return series
