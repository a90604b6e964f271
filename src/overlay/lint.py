"""`overlay lint`: trailers, series <-> folder consistency, Overlay-Check targets, exact apply at the pinned base."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from overlay.errors import ConfigError, OverlayError, PatchError
from overlay.manifest import Manifest, load_engine
from overlay.patching import apply_patch
from overlay.progress import NullReporter, Reporter
from overlay.series import Patch, Series, check_trailers

Severity = Literal["error"]


@dataclass(frozen=True)
class Problem:
    engine: str
    patch: str | None
    message: str
    kind: Literal["config", "apply", "metadata", "location"]
    tip: str | None = None


@dataclass(frozen=True)
class LintReport:
    engine: str
    patches: int
    problems: tuple[Problem, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_target_exists(root: Path, check: str) -> str | None:
    """An Overlay-Check must name something real: a pytest node id or a script path in the repository."""
    path_part, _, node = check.partition("::")
    target = root / path_part
    if not target.is_file():
        return f"Overlay-Check names {path_part!r}, which does not exist in the repository"
    if node:
        name = node.split("::")[-1].split("[")[0]
        text = target.read_text(encoding="utf-8", errors="replace")
        if f"def {name}(" not in text and f"class {name}" not in text:
            return f"Overlay-Check names {check!r}, but {path_part} defines no {name!r}"
    return None


def lint_patch_metadata(root: Path, patch: Patch) -> list[str]:
    problems = check_trailers(patch)
    if patch.check:
        missing = check_target_exists(root, patch.check)
        if missing:
            problems.append(missing)
    return problems


def lint_engine(
    root: Path, engine: str, *, offline: bool = False, reporter: Reporter | None = None
) -> LintReport:
    from overlay.build import load_engine_series  # local: build imports lint-free modules only
    from overlay.fetch import fetch_artifact
    from overlay.wheels import read_wheel

    reporter = reporter or NullReporter()
    problems: list[Problem] = []
    try:
        manifest: Manifest = load_engine(root, engine)
        series: Series = load_engine_series(root, manifest)
    except ConfigError as exc:
        return LintReport(engine=engine, patches=0, problems=(Problem(engine, None, exc.message, "config", exc.tip),))
    previous = 0
    for patch in series.patches:
        if patch.number <= previous:
            problems.append(Problem(engine, patch.name, f"number {patch.number:04d} does not follow {previous:04d}",
                                    "config", f"run `overlay refresh {engine}` to renumber"))
        previous = patch.number
        for msg in lint_patch_metadata(root, patch):
            problems.append(Problem(engine, patch.name, msg, "metadata", _metadata_tip(msg)))
    reporter.step("lint", f"{engine}: {len(series.patches)} patches, checking they apply at {manifest.upstream.version}")
    artifact = manifest.upstream.primary
    if artifact.is_wheel:
        try:
            tree = read_wheel(fetch_artifact(root, manifest, artifact, offline=offline, reporter=reporter)).tree
            for patch in series.patches:
                apply_patch(tree, patch, package_root=manifest.upstream.package_root)
        except PatchError as exc:
            problems.append(Problem(engine, None, exc.message, "apply", "refresh the patch (see `overlay checkout`)"))
        except OverlayError as exc:
            problems.append(Problem(engine, None, exc.message, "config", exc.tip))
    else:
        reporter.step("lint", f"{engine}: sdist pin; exact apply is checked by `overlay apply`")
    return LintReport(engine=engine, patches=len(series.patches), problems=tuple(problems))


def _metadata_tip(message: str) -> str | None:
    if message.startswith("missing trailer"):
        return ("add the four trailers at the end of the commit message (Overlay-Theme, Overlay-Numerics, "
                "Overlay-Check, Upstream-Status), then `overlay refresh`; see docs/dev/patch-authoring.md")
    if "no body" in message:
        return "reword the commit (git commit --amend / rebase -i reword), then `overlay refresh`"
    return None
