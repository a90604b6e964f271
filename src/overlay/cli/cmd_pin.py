"""overlay pin ENGINE --commit SHA [--git URL]: record the upstream commit of the pinned release, after checking it."""

from __future__ import annotations

import argparse
from typing import Any

from overlay.cli.common import add_command, add_engine, add_json, add_wait, resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = (
    "record the git commit the pinned release was built from, after checking that its tree holds the wheel's "
    "Python files (exit 5 naming every file that differs)"
)
EXAMPLE = "overlay pin sglang --commit 0123456789abcdef0123456789abcdef01234567 --dry-run"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "pin", HELP, EXAMPLE, execute)
    add_engine(p)
    p.add_argument(
        "--commit",
        required=True,
        metavar="SHA",
        help="the full 40-hex commit; recorded as upstream.commit and on the series' `# base:` line",
    )
    p.add_argument(
        "--git",
        metavar="URL",
        help="the repository to fetch it from (URL or path), recorded as upstream.git "
        "(default: the manifest's upstream.git, left as it is)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="check and show the new manifest and series; write nothing"
    )
    add_wait(p)
    add_json(p)


def execute(args: argparse.Namespace) -> int:
    from overlay.upstream.pin import pin_commit

    root = resolve_root(args)
    res = pin_commit(
        root=root,
        engine=args.engine,
        commit=args.commit,
        git=args.git,
        dry_run=args.dry_run,
        wait=args.wait,
        reporter=reporter_for(args),
    )
    written = [str(p.relative_to(root)) if p.is_relative_to(root) else str(p) for p in res.written]
    if args.json:
        emit_json(
            {
                "version": 1,
                "engine": res.engine,
                "upstream": res.version,
                "commit": res.commit,
                "git": res.git,
                "artifact": res.artifact,
                "python_files": res.python_files,
                "other_files": res.other_files,
                "other_differences": [{"path": d.path, "kind": d.kind} for d in res.other_differences],
                "dry_run": res.dry_run,
                "written": written,
            }
        )
        return 0
    for d in res.other_differences:
        print(f"NOTE {d.describe()} (not Python: information only)")
    verb = "would write" if res.dry_run else "wrote"
    print(
        f"{res.engine} {res.version}: commit {res.commit} holds the {res.python_files} Python files of {res.artifact}"
    )
    if not written:
        print("already recorded; nothing to write")
    for name in written:
        print(f"{verb} {name}")
    if res.dry_run:
        print("--- manifest")
        print(res.manifest_text, end="")
        print("--- series")
        print(res.series_text, end="")
    return 0
