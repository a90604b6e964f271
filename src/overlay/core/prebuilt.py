"""``overlay apply --prebuilt``: the manifest's [prebuilt] command compiles the engine's native parts from the patched
tree; what it writes is added to the wheel, which is retagged for the interpreter it was built with."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from overlay.core.manifest import Manifest
from overlay.core.wheels import WheelContents, retag
from overlay.errors import ExternalCommandError, UsageError
from overlay.fsutil import safe_relpath
from overlay.proc import run_step
from overlay.progress import Reporter


def run_prebuilt(
    root: Path,
    manifest: Manifest,
    contents: WheelContents,
    scratch: Path,
    *,
    python: Path | None,
    reporter: Reporter,
) -> dict[str, Any]:
    """Run the manifest's [prebuilt] command on the patched tree; add what it writes to the wheel and retag it."""
    assert manifest.prebuilt is not None
    py = str(python or sys.executable)
    try:
        probe = subprocess.run(
            [py, "-c", "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')"],
            capture_output=True,
            text=True,
        )
    except OSError as exc:
        raise UsageError(f"--prebuilt-python {py} cannot be run: {exc}") from None
    if probe.returncode != 0:
        raise UsageError(f"--prebuilt-python {py} does not run: {probe.stderr.strip()[-300:]}")
    pyver = probe.stdout.strip()
    tree_dir, out, info = scratch / "prebuilt-tree", scratch / "prebuilt-out", scratch / "prebuilt-info.json"
    out.mkdir(parents=True)
    for rel, data in contents.tree.files.items():
        target = tree_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    values = {"python": py, "tree": str(tree_dir), "out": str(out), "info": str(info), "root": str(root)}
    command = [part.format(**values) for part in manifest.prebuilt.command]
    proc = run_step(
        command, reporter=reporter, stage="build", what=f"prebuilt: {' '.join(command)}", cwd=root
    )
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()[-2500:]
        cls = UsageError if proc.returncode == 2 else ExternalCommandError
        raise cls(
            f"the prebuilt step of {manifest.name} failed (exit {proc.returncode}): {err}",
            tip=manifest.prebuilt.description or "see the engine's docs page for what the build needs",
        )
    added: list[dict[str, Any]] = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = str(safe_relpath(path.relative_to(out).as_posix(), what="prebuilt output"))
        data = path.read_bytes()
        contents.tree.write(rel, data, executable=bool(path.stat().st_mode & 0o111))
        added.append({"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    if not added:
        raise ExternalCommandError(f"the prebuilt step of {manifest.name} wrote nothing into {{out}}")
    retag(contents, manifest.prebuilt.tag.format(py=pyver))
    details: Any = {}
    if info.is_file():
        try:
            details = json.loads(info.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ExternalCommandError(
                f"the prebuilt step of {manifest.name} wrote an unreadable {info.name}: {exc}",
                tip="fix the [prebuilt] command so that it writes JSON (or nothing)",
            ) from None
    reporter.step(
        "build", f"prebuilt: added {', '.join(str(a['path']) for a in added)}; tag {contents.name.tags}"
    )
    return {"tag": contents.name.tags, "files": added, "details": details}
