"""overlay status [--python PATH]: which pinned engines an environment has, stock or patched, and whether their
files still match RECORD."""

from __future__ import annotations

import argparse
from typing import Any

from overlay.cli.common import add_command, add_json, add_python, resolve_root
from overlay.cli.output import emit_json, reporter_for

HELP = "list the pinned engines installed in an environment: stock or patched, which series, files vs RECORD"
EXAMPLE = "overlay status --python /opt/venv/bin/python"


def configure_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "status",
        HELP,
        EXAMPLE,
        execute,
        notes="Exit 0 whatever is installed; 5 when an installed engine's files differ from RECORD (or the pin).",
    )
    add_python(p)
    add_json(p)


def execute(args: argparse.Namespace) -> int:
    from overlay.deploy.install import status

    root = resolve_root(args)
    target, rows = status(root=root, python=args.python, reporter=reporter_for(args))
    records = []
    for row in rows:
        inst = row.installed
        rec: dict[str, Any] = {
            "engine": row.engine,
            "installed": inst is not None,
            "current": row.current_version,
        }
        if inst is not None:
            prov = inst.provenance or {}
            series = prov.get("series") or {}
            rec.update(
                {
                    "distribution": inst.distribution,
                    "version": inst.version,
                    "kind": inst.kind,
                    "location": str(inst.location),
                    "series_sha256": series.get("sha256"),
                    "patches": len(series.get("patches") or []) if prov else 0,
                    "up_to_date": inst.kind == "patched" and inst.version == row.current_version,
                    "files_ok": inst.files_ok,
                    "pin_checked": inst.pin_checked,
                    "problems": list(inst.record_problems + inst.pin_problems),
                    "shadowed": list(inst.shadowed),
                    "note": row.note,
                }
            )
        records.append(rec)
    bad = any(r.get("installed") and not r["files_ok"] for r in records)
    if args.json:
        emit_json({"version": 1, "python": str(target.python), "engines": records})
    else:
        print(f"python: {target.python}")
        for r in records:
            if not r["installed"]:
                print(f"{r['engine']}: not installed")
                continue
            state = r["kind"]
            if r["kind"] == "patched":
                state += f", {r['patches']} patches, series {str(r['series_sha256'])[:12]}, " + (
                    "current" if r["up_to_date"] else f"not the current build ({r['current']})"
                )
            files = (
                "files match RECORD" + (" and the pin" if r["pin_checked"] else "")
                if r["files_ok"]
                else f"{len(r['problems'])} files differ: " + "; ".join(r["problems"][:3])
            )
            print(
                f"{r['engine']}: {r['distribution']} {r['version']} ({state}); {files}; {r['location']}"
                + (f"; {r['note']}" if r["note"] else "")
            )
    return 5 if bad else 0
