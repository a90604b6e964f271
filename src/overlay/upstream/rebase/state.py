"""The rebase's state (``build/rebase/ENGINE/state.json``), its result and its report (one document: the file and
``--json``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from overlay.core.manifest import Artifact, Manifest, check_engine_name
from overlay.core.series import Patch, load_engine_series
from overlay.errors import ConfigError, UsageError
from overlay.fsutil import atomic_write_json, read_json_state, sha256_bytes
from overlay.git import ops as gitops
from overlay.paths import layout
from overlay.schemas.documents import Artifact as ArtifactDoc
from overlay.schemas.documents import NotReached, OutcomeDoc, RebaseReport, ReportPatch
from overlay.stack.checkout import default_worktree, read_state
from overlay.upstream.outcome import CLASSES, Outcome
from overlay.upstream.workspace import Workspace

STATE_FILE = "state.json"


BACKUP_COMPLETE = "COMPLETE"


LEDGER = "DROPPED"


Status = Literal["published", "stopped", "review", "dry-run"]


LAST_PUBLISH = "last-publish.json"


def state_dir(root: Path, engine: str) -> Path:
    return layout(root).rebase / check_engine_name(engine)


def history_dir(root: Path, engine: str) -> Path:
    return layout(root).rebase_history / check_engine_name(engine)


def report_path(root: Path, engine: str) -> Path:
    return layout(root).reports / f"{engine}-rebase.json"


@dataclass(frozen=True)
class RebaseResult:
    engine: str
    from_version: str
    to_version: str
    status: Status
    outcomes: tuple[Outcome, ...]
    pending: tuple[str, ...]  # patches not reached yet (after a stop)
    repo: Path | None  # the scratch repository while stopped
    report: Path | None
    artifacts: tuple[Artifact, ...]
    series: tuple[str, ...] = ()  # the published series
    seconds: float = 0.0
    warnings: tuple[
        str, ...
    ] = ()  # Overlay-Requires that a dropped or skipped patch broke (lint refuses them)
    review: tuple[str, ...] = ()  # why the rebase stopped before publishing (status "review")
    # the report as written to build/reports/ENGINE-rebase.json (`--json` prints this same document)
    document: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def stopped(self) -> Outcome | None:
        if self.status != "stopped" or not self.outcomes or self.outcomes[-1].resolved:
            return None
        return self.outcomes[-1]

    def counts(self) -> dict[str, int]:
        return {c: sum(1 for o in self.outcomes if o.cls == c) for c in CLASSES}


@dataclass(frozen=True)
class AbortResult:
    engine: str
    removed: Path
    restored: tuple[str, ...]  # files put back from the publish backup (only after an interrupted publish)


@dataclass(frozen=True)
class UndoResult:
    engine: str
    from_version: str  # the pin restored
    to_version: str  # the pin undone
    restored: tuple[str, ...]


def _save_state(sdir: Path, state: dict[str, Any]) -> None:
    atomic_write_json(sdir / STATE_FILE, state)


def _load_state(root: Path, engine: str) -> dict[str, Any]:
    path = state_dir(root, engine) / STATE_FILE
    if not path.is_file():
        raise UsageError(
            f"no rebase of {engine} is in progress (no {path})",
            tip=f"start one with `overlay rebase {engine} --to VERSION`",
        )
    tip = (
        f"`overlay rebase {engine} --abort` discards the rebase (patches/ and overlays/ are put back from its "
        "backup if a publish was interrupted)"
    )
    data = read_json_state(path, what="rebase state", tip=tip)
    problem = _state_problem(data, engine)
    if problem:
        raise ConfigError(f"rebase state {path} has the wrong shape: {problem}", tip=tip)
    state: dict[str, Any] = data
    return state


def _state_problem(data: Any, engine: str) -> str:
    """What is wrong with a parsed ``state.json`` ("" when it has the shape this module writes)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, expected an object"
    if data.get("version") != 1:
        return f"version {data.get('version')!r}, expected 1"
    if data.get("engine") != engine:
        return f"engine {data.get('engine')!r}, expected {engine!r}"
    if data.get("status") not in ("running", "stopped", "review", "publishing"):
        return f"status {data.get('status')!r}"
    for key in ("old_base", "new_base", "head"):
        if not isinstance(data.get(key), str):
            return f"{key!r} is {data.get(key)!r}, expected a commit id"
    frm, to = data.get("from"), data.get("to")
    if not isinstance(frm, dict) or not isinstance(frm.get("version"), str):
        return "'from' has no version"
    if (
        not isinstance(to, dict)
        or not isinstance(to.get("version"), str)
        or not isinstance(to.get("artifacts"), list)
    ):
        return "'to' has no version or artifacts"
    if not all(
        isinstance(a, dict) and isinstance(a.get("filename"), str) and isinstance(a.get("sha256"), str)
        for a in to["artifacts"]
    ):
        return "'to.artifacts' is not a list of {filename, sha256}"
    if not isinstance(data.get("old_commits"), list) or not all(
        isinstance(c, str) for c in data["old_commits"]
    ):
        return "'old_commits' is not a list of commit ids"
    if not isinstance(data.get("patches"), list) or not all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("sha256"), str)
        for p in data["patches"]
    ):
        return "'patches' is not a list of {name, sha256}"
    snap = data.get("snapshot")
    if (
        not isinstance(snap, dict)
        or not isinstance(snap.get("manifest"), str)
        or not isinstance(snap.get("series"), dict)
    ):
        return "'snapshot' has no manifest hash or series"
    renames = data.get("renames", {})
    if not isinstance(renames, dict) or not all(
        isinstance(v, list) and len(v) == 2 for v in renames.values()
    ):
        return "'renames' is not a map of [path, similarity]"
    if not isinstance(data.get("outcomes"), list):
        return "'outcomes' is not a list"
    try:
        for o in data["outcomes"]:
            Outcome.from_json(o)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"an entry of 'outcomes' does not read ({type(exc).__name__}: {exc})"
    return ""


def _workspace(root: Path, state: dict[str, Any]) -> Workspace:
    return Workspace(
        repo=state_dir(root, state["engine"]) / "repo",
        old_base=state["old_base"],
        new_base=state["new_base"],
        old_commits=tuple(state["old_commits"]),
        new_version=state["to"]["version"],
        renames={a: (b, int(s)) for a, (b, s) in state.get("renames", {}).items()},
    )


def _old_patches(root: Path, manifest: Manifest, state: dict[str, Any]) -> tuple[Patch, ...]:
    series = load_engine_series(root, manifest)
    recorded = [(p["name"], p["sha256"]) for p in state["patches"]]
    if [(p.name, p.sha256) for p in series.patches] != recorded:
        raise UsageError(
            f"patches/{manifest.name} changed while the rebase was stopped",
            tip=f"put it back, or `overlay rebase {manifest.name} --abort` and start again",
        )
    return series.patches


def _snapshot(root: Path, manifest: Manifest) -> dict[str, Any]:
    series_dir = manifest.series_dir(root)
    return {
        "manifest": sha256_bytes(manifest.path.read_bytes()),
        "series": {p.name: sha256_bytes(p.read_bytes()) for p in sorted(series_dir.iterdir()) if p.is_file()},
    }


def _check_snapshot(root: Path, manifest: Manifest, state: dict[str, Any]) -> None:
    now = _snapshot(root, manifest)
    if now != state["snapshot"]:
        what = (
            manifest.path.name
            if now["manifest"] != state["snapshot"]["manifest"]
            else f"patches/{manifest.name}"
        )
        raise UsageError(
            f"{what} changed while the rebase of {manifest.name} was in progress; publishing now would overwrite that",
            tip=f"undo the change, or `overlay rebase {manifest.name} --abort` and start again",
        )


def _checkout_guard(root: Path, engine: str) -> None:
    """Refuse to rebase under a checkout worktree that holds work ``refresh`` has not written back."""
    wt = default_worktree(root, engine)
    if not (wt / ".git").is_dir():
        return
    tip = (
        f"`overlay refresh {engine}` first (or discard the work), or pass --force to rebase the series as it is in "
        f"patches/{engine} (the worktree stays on the old base)"
    )
    # --no-optional-locks: looking must not rewrite the worktree's index (abort promises a byte-identical worktree)
    dirty = gitops.status_paths(wt, optional_locks=False)
    if dirty:
        raise UsageError(
            f"{wt} has uncommitted changes ({', '.join(dirty[:3])}{' ...' if len(dirty) > 3 else ''})",
            tip=tip,
        )
    try:
        st = read_state(wt, engine=engine)
    except UsageError:
        return
    proc = gitops.run(
        ["rev-list", "--reverse", "--end-of-options", f"{st['base']}..HEAD"], cwd=wt, check=False
    )
    commits = proc.stdout.decode().split()
    if proc.returncode != 0 or commits != [p["commit"] for p in st.get("patches", [])]:
        raise UsageError(
            f"{wt} has commits that `overlay refresh` has not written back to patches/{engine}", tip=tip
        )


def _artifact_json(a: Artifact) -> ArtifactDoc:
    d: ArtifactDoc = {"filename": a.filename, "sha256": a.sha256}
    if a.url:
        d["url"] = a.url
    return d


def _artifact_from_json(d: dict[str, str]) -> Artifact:
    return Artifact(filename=d["filename"], sha256=d["sha256"], url=d.get("url"))


def _result(
    root: Path,
    state: dict[str, Any],
    outcomes: list[Outcome],
    patches: tuple[Patch, ...],
    status: Status,
    repo: Path | None,
    *,
    series: tuple[str, ...] = (),
) -> RebaseResult:
    result = RebaseResult(
        engine=state["engine"],
        from_version=state["from"]["version"],
        to_version=state["to"]["version"],
        status=status,
        outcomes=tuple(outcomes),
        pending=tuple(p.name for p in patches[len(outcomes) :]),
        repo=repo,
        report=report_path(root, state["engine"]),
        artifacts=tuple(_artifact_from_json(a) for a in state["to"]["artifacts"]),
        series=series,
        seconds=float(state.get("seconds", 0.0)),
        warnings=_requires_warnings(outcomes, patches),
        review=tuple(state.get("review", ())) if status == "review" else (),
    )
    return replace(result, document=report_json(result, patches, state))


def _requires_warnings(outcomes: Sequence[Outcome], patches: tuple[Patch, ...]) -> tuple[str, ...]:
    """The Overlay-Requires of the patches still in the series (kept or not reached) that a drop or --skip broke."""
    from overlay.core.lint import requires_warnings

    dropped = {o.name for o in outcomes if o.dropped}
    return requires_warnings([p for p in patches if p.name not in dropped])


def _report_patch(outcome: OutcomeDoc, upstream_status: str | None) -> ReportPatch:
    return cast(ReportPatch, {**outcome, "upstream_status": upstream_status})


def report_json(
    result: RebaseResult, patches: tuple[Patch, ...] = (), state: dict[str, Any] | None = None
) -> RebaseReport:
    by_name = {p.name: p for p in patches}
    stopped = result.stopped
    return {
        "version": 1,
        "engine": result.engine,
        "status": result.status,
        "from": state["from"] if state else {"version": result.from_version},
        "to": state["to"]
        if state
        else {"version": result.to_version, "artifacts": [_artifact_json(a) for a in result.artifacts]},
        "patches": [
            *(
                _report_patch(o.to_json(), by_name[o.name].upstream_status if o.name in by_name else None)
                for o in result.outcomes
            ),
            *(NotReached({"name": n, "class": None, "resolution": "not reached"}) for n in result.pending),
        ],
        "counts": result.counts(),
        "conflicts": {
            "own": sum(1 for o in result.outcomes if o.conflict_kind == "own"),
            "inherited": sum(1 for o in result.outcomes if o.conflict_kind == "inherited"),
        },
        "stopped": None
        if stopped is None
        else {
            "patch": stopped.name,
            "class": stopped.cls,
            "detail": stopped.detail,
            "paths": list(stopped.conflicts or stopped.gone or [r[0] for r in stopped.renames]),
            "worktree": str(result.repo) if result.repo else None,
        },
        "series": list(result.series),
        "bases": {"old": state["old_base"], "new": state["new_base"]} if state else None,
        "seconds": round(result.seconds, 3),
        "warnings": list(result.warnings),
        "review": list(result.review),
    }


def _write_report(
    root: Path, state: dict[str, Any], result: RebaseResult, patches: tuple[Patch, ...]
) -> None:
    atomic_write_json(
        report_path(root, state["engine"]), dict(result.document or report_json(result, patches, state))
    )
