"""`overlay review ENGINE --from A --to B`: what upstream changed between two releases in the code our series touches.

- The files our patches touch, and within them the Python functions and classes our hunks sit in (:mod:`overlay.upstream.astmap`),
  compared between A and B: unchanged, changed, rewritten, moved, renamed, deleted. A symbol we patch that upstream
  rewrote, moved, renamed or deleted is flagged.
- New upstream code that duplicates a patch (a candidate for dropping): the patch reverse-applies on B, or B's
  version of a symbol we patch has the same AST as our patched version, or most lines the patch adds are new in B.
- A range-diff (``git range-diff``) between the series at A and the series at B: for each patch, identical,
  context-only (same changed lines, other context or line numbers), changed, dropped or added; and the hunk-location
  check (a hunk that now sits in another function or class than at A).

Where the two series come from: the one in ``patches/ENGINE`` (based on A or on B); the other from
``--old-series DIR``, the copy ``overlay rebase`` keeps (``build/rebase-history``), or the overlay repository's own git
history; when the series is still at A and no rebased one exists, the rebase is replayed on the fly (nothing is
written) and its classification is part of the review.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from overlay.core.manifest import load_engine
from overlay.core.series import Series, load_series, parse_patch_bytes
from overlay.errors import ConfigError, PatchError, UsageError
from overlay.fsutil import atomic_write_json, atomic_write_text, owned_scratch
from overlay.paths import layout
from overlay.progress import NullReporter, Reporter
from overlay.stack.checkout import base_message, commit_patch
from overlay.upstream.outcome import Outcome
from overlay.upstream.releases import check_version, manifest_at, resolve_release, wheel_tree
from overlay.upstream.replay import replay_all
from overlay.upstream.review.analysis import _analyse
from overlay.upstream.review.history import _rebase_record, _series_at, find_old_series
from overlay.upstream.review.model import ReviewResult, to_json
from overlay.upstream.workspace import commit_patch_bytes, prepare


def report_path(root: Path, engine: str) -> Path:
    return layout(root).reports / f"{engine}-review.json"


# ------------------------------------------------------------------ entry point


def review(
    *,
    root: Path,
    engine: str,
    from_version: str,
    to_version: str,
    old_series: Path | None = None,
    from_url: str | None = None,
    to_url: str | None = None,
    html: Path | None = None,
    offline: bool = False,
    reporter: Reporter | None = None,
) -> ReviewResult:
    reporter = reporter or NullReporter()
    t0 = time.perf_counter()
    manifest = load_engine(root, engine)
    a, b = check_version(from_version), check_version(to_version)
    if a == b:
        raise UsageError(f"--from and --to are both {a}; name two releases")
    current = load_series(manifest.series_dir(root), root=root)
    if current.engine != engine:
        raise ConfigError(
            f"{manifest.series_dir(root)}/series is the series of {current.engine!r}, not {engine!r}"
        )
    notes: list[str] = []
    old: Series | None = None
    new: Series | None = None
    old_source = new_source = ""
    with owned_scratch(layout(root).tmp, f"review-{engine}") as scratch:
        if old_series is not None:
            old = _series_at(load_series(old_series), a, str(old_series))
            old_source = str(old_series)
        if current.base_version == a and old is None:
            old, old_source = current, f"patches/{engine}"
        elif current.base_version == b:
            new, new_source = current, f"patches/{engine}"
        elif old is None:
            raise UsageError(
                f"patches/{engine} is based on {current.base_version}, neither --from {a} nor --to {b}",
                tip="review the releases the series moves between, or pass --old-series DIR (the series at --from)",
            )
        if old is None:
            found = find_old_series(root, manifest, a, b, scratch / "old-series")
            if found is not None:
                old, old_source = found
            else:
                notes.append(
                    f"no copy of the series at {a} was found (rebase history, git history of the overlay "
                    "repository): no range-diff; hunks were located in the series at " + b
                )
        rel_a = resolve_release(
            root, manifest, a, url=from_url, primary_only=True, offline=offline, reporter=reporter
        )
        rel_b = resolve_release(
            root, manifest, b, url=to_url, primary_only=True, offline=offline, reporter=reporter
        )
        pr = manifest.upstream.package_root
        allow = manifest.upstream.allow_members
        files_a = wheel_tree(rel_a.primary_path, pr, allow_members=allow)
        files_b = wheel_tree(rel_b.primary_path, pr, allow_members=allow)
        reporter.step(
            "review",
            f"{engine}: {a} -> {b}; series at {a}: {old_source or 'none'}; at {b}: "
            f"{new_source or ('replayed now' if old else 'none')}",
        )
        ws = prepare(
            scratch / "repo",
            old_files=files_a,
            old_message=base_message(manifest_at(manifest, a, rel_a.artifacts)),
            new_files=files_b,
            new_message=base_message(manifest_at(manifest, b, rel_b.artifacts)),
            patches=old.patches if old else (),
            new_version=b,
            reporter=reporter,
        )
        outcomes: list[Outcome] = []
        mapping: dict[str, str] | None = None
        if new is None:
            assert old is not None
            outcomes = replay_all(ws, old.patches, stop=False, reporter=reporter)
            new_source = f"replayed now from the series at {a} (nothing written)"
            new_commits = [o.commit for o in outcomes if o.commit]
            new_patches = [
                parse_patch_bytes(commit_patch_bytes(ws.repo, c), name=o.name)
                for o, c in ((o, o.commit) for o in outcomes if o.commit)
                if c
            ]
            mapping = {o.name: o.name for o in outcomes if o.commit}
        else:
            recorded = _rebase_record(root, engine, a, b) if old is not None else None
            if recorded is not None:
                outcomes = recorded
                mapping = {o.name: o.new_name for o in recorded if o.new_name}
            new_commits, new_patches = [], list(new.patches)
            for patch in new.patches:
                try:
                    new_commits.append(commit_patch(ws.repo, patch))
                except PatchError as exc:
                    raise PatchError(
                        exc.message, tip=f"the series in {new_source} must apply exactly at {b}"
                    ) from None
        result = _analyse(
            engine,
            a,
            b,
            ws,
            files_a,
            files_b,
            old,
            new_patches,
            new_commits,
            outcomes,
            notes,
            old_source=old_source,
            new_source=new_source,
            mapping=mapping,
        )
    result = dataclasses.replace(result, seconds=time.perf_counter() - t0)
    json_path = report_path(root, engine)
    atomic_write_json(json_path, to_json(result))
    result = dataclasses.replace(result, json_path=json_path)
    if html is not None:
        from overlay.upstream.review.html import render_review

        atomic_write_text(html, render_review(result))
        result = dataclasses.replace(result, html_path=html)
    reporter.step("review", f"report {json_path}" + (f", html {html}" if html else ""))
    return result


# ------------------------------------------------------------------ analysis


# ------------------------------------------------------------------ output
