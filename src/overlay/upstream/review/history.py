"""Finding the series as it was at another release: from the rebase history, or from the repository's git history
(I/O only; the comparison is :mod:`.analysis`)."""

from __future__ import annotations

import json
from pathlib import Path

from overlay.core.manifest import Manifest
from overlay.core.series import Series, load_series
from overlay.errors import UsageError
from overlay.git import ops as gitops
from overlay.upstream.outcome import Outcome
from overlay.upstream.rebase import history_dir


def _rebase_record(root: Path, engine: str, a: str, b: str) -> list[Outcome] | None:
    """The outcomes of the rebase a -> b, from the report ``overlay rebase`` kept (None when there is none)."""
    path = history_dir(root, engine) / f"{a}-to-{b}" / "report.json"
    if not path.is_file():
        return None
    try:
        return [Outcome.from_json(p) for p in json.loads(path.read_text())["patches"] if p.get("class")]
    except (ValueError, KeyError, TypeError):
        return None


def _series_at(series: Series, version: str, where: str) -> Series:
    if series.base_version != version:
        raise UsageError(f"{where}/series is based on {series.base_version}, not --from {version}")
    return series


def find_old_series(root: Path, manifest: Manifest, a: str, b: str, dest: Path) -> tuple[Series, str] | None:
    """The series at ``a``: the copy ``overlay rebase a -> b`` kept, else the newest commit of the overlay repository
    whose ``series`` is based on ``a``."""
    hist = history_dir(root, manifest.name) / f"{a}-to-{b}" / "old"
    if (hist / "series").is_file():
        return _series_at(load_series(hist), a, str(hist)), str(hist.relative_to(root))
    rel = manifest.series_dir(root).relative_to(root).as_posix()
    probe = gitops.run(["rev-parse", "--show-toplevel"], cwd=root, check=False)
    if probe.returncode != 0:
        return None
    top = Path(probe.stdout.decode().strip())
    prefix = root.resolve().relative_to(top.resolve()).as_posix()
    path = f"{prefix}/{rel}" if prefix not in ("", ".") else rel
    log = (
        gitops.run(["log", "--format=%H", "--", f"{path}/series"], cwd=top, check=False)
        .stdout.decode()
        .split()
    )
    for commit in log:
        text = gitops.run(["show", f"{commit}:{path}/series"], cwd=top, check=False).stdout.decode(
            "utf-8", "replace"
        )
        fields = text.split("\n", 1)[0].removeprefix("# base:").split()
        if len(fields) == 3 and fields[1] == a:
            names = gitops.z_paths(["ls-tree", "--name-only", "-z", f"{commit}:{path}"], cwd=top)
            dest.mkdir(parents=True, exist_ok=True)
            for name in names:
                if name == "series" or name.endswith(".patch"):
                    (dest / name).write_bytes(gitops.run(["show", f"{commit}:{path}/{name}"], cwd=top).stdout)
            return load_series(dest), f"git {commit[:12]}:{path}"
    return None
