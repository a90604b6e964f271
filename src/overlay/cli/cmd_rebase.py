"""overlay rebase ENGINE --to VERSION (--continue / --skip / --abort): move the series onto a new upstream release."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from overlay.cli.common import add_command, add_engine, add_json, add_offline, add_wait, resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = (
    "move the series onto another upstream release, classifying every patch (exit 3 when it stops on a conflict "
    "or for review before publishing)"
)
EXAMPLE = "overlay rebase mlx-lm --to 0.32.1"


def configure_parser(sub: Any) -> None:
    p = add_command(sub, "rebase", HELP, EXAMPLE, execute)
    add_engine(p)
    action = p.add_mutually_exclusive_group()
    action.add_argument("--to", metavar="VERSION", help="the upstream release to move to")
    action.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="take the resolution of the stopped patch (the scratch repository's work tree) and go on",
    )
    action.add_argument(
        "--skip", action="store_true", help="drop the stopped patch (recorded in DROPPED) and go on"
    )
    action.add_argument(
        "--abort",
        action="store_true",
        help="give up: remove the rebase state; patches/, overlays/ and worktrees stay as they were",
    )
    action.add_argument(
        "--publish",
        action="store_true",
        help="publish a rebase stopped for review (a merged patch, a warning, or a target older than the pin)",
    )
    action.add_argument(
        "--undo",
        action="store_true",
        help="put the manifest, series and patches back as they were before the last publish, byte for byte",
    )
    p.add_argument(
        "--url",
        help="with --to: a direct location (file:// or https://) of the new release's wheel "
        "instead of the package index",
    )
    p.add_argument(
        "--commit", help="with --to: the new release's 40-hex git commit, recorded in the manifest and series"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="with --to: classify every patch, write nothing, never stop"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --to: rebase even when build/worktrees/ENGINE holds work refresh has not written back",
    )
    add_offline(p)
    add_wait(p)
    add_json(p, "print the report as JSON")


def execute(args: argparse.Namespace) -> int:
    from overlay.errors import ConflictError, UsageError
    from overlay.upstream import rebase as rb

    root = resolve_root(args)
    rep = reporter_for(args)
    if args.abort:
        res = rb.abort(root=root, engine=args.engine, wait=args.wait, reporter=rep)
        if args.json:
            emit_json({"version": 1, "engine": res.engine, "aborted": True, "restored": list(res.restored)})
        else:
            undone = (
                f"; the interrupted publish was undone ({len(res.restored)} files put back)"
                if res.restored
                else ""
            )
            print(f"rebase of {res.engine} aborted; nothing was published{undone}")
        return 0
    if args.undo:
        back = rb.undo(root=root, engine=args.engine, wait=args.wait, reporter=rep)
        if args.json:
            emit_json(
                {
                    "version": 1,
                    "engine": back.engine,
                    "back": True,
                    "pin": back.from_version,
                    "restored": list(back.restored),
                }
            )
        else:
            print(
                f"rebase of {back.engine} {back.from_version} -> {back.to_version} back: pinned at "
                f"{back.from_version} again ({len(back.restored)} files put back)"
            )
        return 0
    if args.publish:
        result = rb.publish(root=root, engine=args.engine, wait=args.wait, reporter=rep)
    elif args.cont or args.skip:
        result = rb.resume(root=root, engine=args.engine, skip=args.skip, wait=args.wait, reporter=rep)
    elif args.to:
        result = rb.rebase(
            root=root,
            engine=args.engine,
            to=args.to,
            url=args.url,
            commit=args.commit,
            force=args.force,
            dry_run=args.dry_run,
            offline=args.offline,
            wait=args.wait,
            reporter=rep,
        )
    else:
        current = rb.status(root=root, engine=args.engine)
        if current is None:
            raise UsageError(f"no rebase of {args.engine} is in progress", tip="start one with --to VERSION")
        result = current
    if args.json:
        emit_json(dict(result.document) if result.document is not None else rb.report_json(result))
    else:
        print_table(result)
        skipped = [o.name for o in result.outcomes if o.resolution == "skipped"]
        if args.skip and skipped:
            needs = [w.split(":", 1)[0] for w in result.warnings if f"'{skipped[-1]}'" in w]
            if needs:
                print(
                    f"WARNING --skip dropped {skipped[-1]}, which {', '.join(needs)} "
                    f"require{'s' if len(needs) == 1 else ''} (Overlay-Requires)",
                    file=sys.stderr,
                )
    if result.status == "review":
        e, a, b = result.engine, result.from_version, result.to_version
        for reason in result.review:
            print(f"REVIEW {reason}")
        print("next steps:")
        print(
            f"  look:     overlay review {e} --from {a} --to {b} --html build/reports/{e}-review.html"
            f"  (the rebased commits are in {result.repo})"
        )
        print(f"  publish:  overlay rebase {e} --publish, then `overlay lint {e}` and `overlay check {e}`")
        print(
            f"  undo:     overlay rebase {e} --undo puts the old series back after a publish; --abort gives up now"
        )
        raise ConflictError(
            f"rebase of {e} {a} -> {b} stopped for review before publishing: {'; '.join(result.review)}",
            tip=f"review it, then `overlay rebase {e} --publish` (or --abort)",
        )
    stopped = result.stopped
    if stopped is not None:
        what = "conflicts in " + ", ".join(stopped.conflicts) if stopped.conflicts else stopped.detail
        raise ConflictError(
            f"rebase stopped at {stopped.name} ({stopped.cls}): {what}. The attempt is in {result.repo}",
            tip=f"finish it there (edit, `git add`), then `overlay rebase {result.engine} --continue`; "
            f"or --skip to drop this patch, or --abort to give up",
        )
    return 0


def print_table(result: Any) -> None:
    width = max([len(o.name) for o in result.outcomes] + [len(n) for n in result.pending] + [5])
    print(f"rebase {result.engine} {result.from_version} -> {result.to_version}: {result.status}")
    print(f"{'patch':<{width}}  {'class':<10}  {'result':<9}  detail")
    for o in result.outcomes:
        if o.resolution == "pending" and o.conflict_kind == "inherited":
            res = "inherited"
        elif o.resolution == "pending":
            res = "STOPPED" if result.status == "stopped" else "would stop"
        elif o.commit is None:
            res = o.resolution if o.resolution in ("skipped", "dropped") else "dropped"
        elif o.new_name and o.new_name != o.name:
            res = "-> " + o.new_name[:4]
        else:
            res = "ok" if o.resolution == "auto" else "resolved"
        print(f"{o.name:<{width}}  {o.cls:<10}  {res:<9}  {o.detail}")
        for m in o.moved:
            print(f"{'':<{width}}  {'':<10}  {'':<9}  WARNING hunk moved: {m.describe()}", file=sys.stdout)
    for n in result.pending:
        print(f"{n:<{width}}  {'-':<10}  {'pending':<9}")
    counts = ", ".join(f"{k} {v}" for k, v in result.counts().items() if v)
    own = sum(1 for o in result.outcomes if o.conflict_kind == "own")
    inherited = sum(1 for o in result.outcomes if o.conflict_kind == "inherited")
    if own or inherited:
        counts += (
            f"; of the conflicts {own} are the patches' own, {inherited} inherited (they go away once the "
            "earlier ones are resolved)"
        )
    print(
        f"{len(result.outcomes)} of {len(result.outcomes) + len(result.pending)} patches: {counts or 'none'}"
        + (f"; report {result.report}" if result.report else "")
    )
    for w in getattr(result, "warnings", ()):
        print(f"WARNING {w}", file=sys.stderr)
