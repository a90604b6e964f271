"""overlay apply ENGINE: apply the series strictly and build the patched drop-in wheel (its path printed last)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from overlay.cli.common import add_command, add_engine, add_json, add_offline, resolve_root, resolved
from overlay.cli.output import emit_json, reporter_for
from overlay.schemas.documents import Provenance as ProvenanceDoc

if TYPE_CHECKING:
    from overlay.core.build import BuildResult

HELP = (
    "apply the series strictly and build the patched wheel of every pinned artifact; prints the wheel paths"
)
EXAMPLE = "overlay apply mlx-lm --upto 2"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "apply", HELP, EXAMPLE, execute)
    add_engine(p)
    p.add_argument("--out", type=Path, help="folder for the wheel (default: build/wheels/ENGINE)")
    p.add_argument("--upto", type=int, metavar="N", help="apply only the first N patches")
    p.add_argument(
        "--source",
        choices=("pypi", "git"),
        default="pypi",
        help="upstream tree: the pinned release artifact (default) or a git checkout at the pinned commit",
    )
    p.add_argument("--git-url", help="git URL or local path for --source git (default: upstream.git)")
    p.add_argument("--commit", help="commit for --source git (default: upstream.commit)")
    p.add_argument(
        "--artifact",
        metavar="FILENAME",
        help="patch only this pinned artifact (default: every pinned wheel, the primary one printed last); "
        "`primary` names the first wheel",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="delete the older builds of the distribution from the output folder (default: list them)",
    )
    p.add_argument(
        "--prebuilt",
        action="store_true",
        help="also compile the engine's native parts from the patched tree (manifest [prebuilt]) into the wheel",
    )
    p.add_argument(
        "--prebuilt-python",
        type=Path,
        metavar="PYTHON",
        help="interpreter for the prebuilt step (one with the engine's build deps, e.g. CUDA torch)",
    )
    add_offline(p)
    p.add_argument(
        "--allow-unlinted",
        action="store_true",
        help="build even if the series fails lint's static checks (trailers, numbering); overlay.json "
        "records the problems",
    )
    add_json(p)


def execute(args: argparse.Namespace) -> int:
    from overlay.core.build import apply_engine

    root = resolve_root(args)
    if args.artifact is None and args.source == "pypi" and not args.prebuilt:
        return _apply_all(args, root)
    result = apply_engine(
        root=root,
        engine=args.engine,
        out_dir=resolved(args.out),
        upto=args.upto,
        source=args.source,
        git_url=args.git_url,
        commit=args.commit,
        offline=args.offline,
        artifact_name=None if args.artifact == "primary" else args.artifact,
        prebuilt=args.prebuilt,
        prebuilt_python=args.prebuilt_python,
        allow_unlinted=args.allow_unlinted,
        reporter=reporter_for(args),
    )
    if args.json:
        emit_json(_built_json(result))
    else:
        print(result.wheel)
    return 0


def _apply_all(args: argparse.Namespace, root: Path) -> int:
    from overlay.deploy.artifacts import apply_all

    every = apply_all(
        root=root,
        engine=args.engine,
        out_dir=resolved(args.out),
        upto=args.upto,
        offline=args.offline,
        allow_unlinted=args.allow_unlinted,
        prune_stale=args.prune,
        reporter=reporter_for(args),
    )
    result = every.primary
    if args.json:
        emit_json(
            {
                **_built_json(result),
                "wheels": [
                    {"wheel": str(r.wheel), "artifact": _artifact_name(r.provenance)} for r in every.results
                ],
                "stale": [str(w.path) for w in every.stale],
                "pruned": [str(p) for p in every.pruned],
            }
        )
    else:
        for built in every.results:
            print(built.wheel)
    return 0


def _built_json(result: BuildResult) -> dict[str, Any]:
    """The JSON of one built wheel (for the whole set, that of the primary one)."""
    return {
        "version": 1,
        "wheel": str(result.wheel),
        "wheel_version": result.version,
        "patches": [p.name for p in result.patches],
        "provenance": result.provenance,
    }


def _artifact_name(provenance: ProvenanceDoc) -> str | None:
    artifact = provenance["upstream"]["artifact"]
    return None if artifact is None else artifact["filename"]
