"""overlay list: engines, pinned upstream version, number of patches, last build."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlay.cli.common import add_command, add_json, resolve_root
from overlay.cli.output import emit_json
from overlay.core.manifest import engine_names, load_engine
from overlay.errors import ConfigError, IntegrityError, OverlayError
from overlay.fsutil import read_json_state
from overlay.paths import layout

HELP = "list engines, their pinned upstream, patch count and last build"
EXAMPLE = "overlay list --json"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "list", HELP, EXAMPLE, execute)
    add_json(p, "machine-readable output")


def _last_build(path: Path, engine: str) -> dict[str, Any] | None:
    """The build state ``overlay apply`` writes (None before the first build); a corrupt one is a ConfigError."""
    if not path.exists():
        return None
    tip = f"`overlay apply {engine}` writes it again (or delete {path})"
    data = read_json_state(path, what="build state", tip=tip)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("wheel"), str)
        or not isinstance(data.get("wheel_version"), str)
    ):
        raise ConfigError(
            f"build state {path} has the wrong shape: expected an object with 'wheel' and "
            f"'wheel_version' strings",
            tip=tip,
        )
    return data


def execute(args: argparse.Namespace) -> int:
    from overlay.core.series import load_engine_series

    root = resolve_root(args)
    rows: list[dict[str, Any]] = []
    for name in engine_names(root):
        manifest = load_engine(root, name)
        try:
            patches: int | str = len(load_engine_series(root, manifest).patches)
        except IntegrityError:
            raise  # a link out of the repository is not a state to list past (docs/security.md)
        except OverlayError as exc:
            patches = f"error: {exc.message}"
        last = _last_build(layout(root).state / f"{name}.json", name)
        rows.append(
            {
                "engine": name,
                "distribution": manifest.distribution,
                "upstream": manifest.upstream.version,
                "commit": manifest.upstream.commit,
                "patches": patches,
                "last_build": None
                if last is None
                else {"wheel": last["wheel"], "version": last["wheel_version"]},
            }
        )
    if args.json:
        emit_json({"version": 1, "engines": rows})
        return 0
    print(f"{'engine':<12} {'upstream':<10} {'patches':>7}  last build")
    for r in rows:
        built = r["last_build"]["version"] if r["last_build"] else "-"
        print(f"{r['engine']:<12} {r['upstream']:<10} {r['patches']!s:>7}  {built}")
    return 0
