"""`overlay lint`: trailers, series <-> folder consistency, Overlay-Check targets, exact apply at the pinned base."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from overlay.core.archive_policy import MemberPolicy, patch_problems
from overlay.core.manifest import Manifest, load_engine
from overlay.core.mechanism import (
    MECHANISM_THEMES,
    Flag,
    Mechanism,
    parse_flag,
    parse_mechanism,
    patch_slug,
    requires_problems,
)
from overlay.core.patching import apply_patch
from overlay.core.series import Hunk, Patch, Series, check_trailers
from overlay.errors import ConfigError, IntegrityError, OverlayError, PatchError
from overlay.progress import NullReporter, Reporter

Severity = Literal["error"]
_PATCH_FILE = re.compile(r"^\d{4}-[A-Za-z0-9][A-Za-z0-9._-]*\.patch$")


@dataclass(frozen=True)
class Problem:
    engine: str
    patch: str | None
    message: str
    kind: Literal["config", "apply", "metadata", "location", "integrity"]
    tip: str | None = None


@dataclass(frozen=True)
class LintReport:
    engine: str
    patches: int
    problems: tuple[Problem, ...] = field(default_factory=tuple)
    warnings: tuple[str, ...] = ()  # printed, never a failure (merge hotspots)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_target_expected(root: Path, check: str) -> bool:
    """Whether the repository should hold ``check``'s file: it has a ``tests/`` folder, or the folder the path names
    exists (a bare file name: the root). A patches-only repository (`overlay init`) has neither for
    ``tests/...``: its Overlay-Check targets are unresolved, a lint warning (:func:`unresolved_checks`), not errors."""
    path_part = check.partition("::")[0]
    return (root / "tests").is_dir() or (root / path_part).parent.is_dir()


def check_target_exists(root: Path, check: str) -> str | None:
    """An Overlay-Check must name something real: a pytest node id or a script path in the repository; one the
    repository cannot be expected to hold (:func:`check_target_expected`) is left to :func:`unresolved_checks`."""
    path_part, _, node = check.partition("::")
    target = root / path_part
    if not target.is_file():
        if not check_target_expected(root, check):
            return None
        return f"Overlay-Check names {path_part!r}, which does not exist in the repository"
    if node:
        from overlay.core.inputs import read_inside

        name = node.split("::")[-1].split("[")[0]
        text = read_inside(root, target, what="Overlay-Check target").decode("utf-8", "replace")
        if f"def {name}(" not in text and f"class {name}" not in text:
            return f"Overlay-Check names {check!r}, but {path_part} defines no {name!r}"
    return None


def unresolved_checks(root: Path, patches: Sequence[Patch]) -> tuple[str, ...]:
    """One warning per patch whose Overlay-Check names a file this repository does not have and, having no tests/
    folder (nor the folder named), cannot be expected to: lint cannot resolve it and `overlay check` cannot run it."""
    out = []
    for patch in patches:
        if (
            patch.check
            and not (root / patch.check.partition("::")[0]).is_file()
            and not check_target_expected(root, patch.check)
        ):
            out.append(
                f"{patch.name}: Overlay-Check {patch.check!r} is not in this repository (it has no tests/ "
                "folder): not resolved, and `overlay check` cannot run it; add the test here (tests/...) "
                "to have it checked"
            )
    return tuple(out)


def lint_patch_metadata(
    root: Path, patch: Patch, *, engine: str | None = None, series: tuple[Patch, ...] | None = None
) -> list[str]:
    """The patch's trailers; with ``engine`` the mechanism scenarios are that engine's, with ``series`` (the whole
    series, ``patch`` among it) every Overlay-Requires must name an earlier patch of it."""
    problems = check_trailers(patch)
    if patch.check:
        missing = check_target_exists(root, patch.check)
        if missing:
            problems.append(missing)
    problems.extend(check_declarations(patch, engine=engine, series=series))
    return problems


def requires_warnings(patches: Sequence[Patch]) -> tuple[str, ...]:
    """For refresh and rebase, which reorder and drop patches: one line per Overlay-Requires that no longer names an
    earlier patch of ``patches`` (the new series, in order). Warnings, not errors: `overlay lint` refuses them."""
    return tuple(
        f"{name}: {msg}; move the patch after the one it needs, or restore that one "
        f"(or remove the Overlay-Requires line if it no longer applies)"
        for name, msg in requires_problems([(p.name, p.requires) for p in patches])
    )


def _added_text(patch: Patch) -> str:
    return b"".join(
        line.text for f in patch.files for h in f.hunks for line in h.lines if line.op == "+"
    ).decode("utf-8", "replace")


def check_declarations(
    patch: Patch, *, engine: str | None = None, series: tuple[Patch, ...] | None = None
) -> list[str]:
    """Overlay-Flag, Overlay-Mechanism and Overlay-Requires (DESIGN.md, "Trailers for flags, mechanisms and
    dependencies"): syntax, every name exists, the flag is one the diff (or a patch it requires) adds."""
    problems: list[str] = []
    by_slug = {patch_slug(p.name): p for p in series or ()}
    required = [by_slug[patch_slug(r)] for r in patch.requires if patch_slug(r) in by_slug]
    flag_values = patch.trailer_values("Overlay-Flag")
    if not flag_values:
        problems.append(
            "missing trailer Overlay-Flag: (ENV=VALUE, a --cli-option, or `default` for an always-on patch)"
        )
    flags: list[Flag] = []
    for value in flag_values:
        try:
            flags.append(parse_flag(value))
        except ConfigError as exc:
            problems.append(exc.message)
    if len(flags) > 1 and any(f.kind == "default" for f in flags):
        problems.append("Overlay-Flag `default` (always on) cannot be combined with other Overlay-Flag lines")
    texts = [_added_text(patch)] + [_added_text(p) for p in required]
    for flag in flags:
        if flag.kind != "default" and not any(flag.name in text for text in texts):
            where = "its diff" + (" or the diff of a patch it requires" if required else "")
            problems.append(f"Overlay-Flag {flag.text!r}: {flag.name} is not in any line {where} adds")
    mechanisms: list[Mechanism] = []
    for value in patch.trailer_values("Overlay-Mechanism"):
        try:
            mechanisms.append(parse_mechanism(value, engine=engine))
        except ConfigError as exc:
            problems.append(exc.message)
    seen: set[Mechanism] = set()
    for m in mechanisms:
        if m in seen:
            problems.append(f"Overlay-Mechanism {m.text!r} is declared twice")
        seen.add(m)
    if patch.theme in MECHANISM_THEMES and not patch.trailer_values("Overlay-Mechanism"):
        problems.append(
            f"Overlay-Theme {patch.theme} needs at least one Overlay-Mechanism: METRIC DIRECTION in SCENARIO "
            f"(themes that must: {', '.join(MECHANISM_THEMES)})"
        )
    for req in patch.requires:
        if not _PATCH_FILE.match(req):
            problems.append(f"Overlay-Requires {req!r} is not a patch file name (NNNN-slug.patch)")
    if series is not None:
        order = [(p.name, p.requires) for p in series]
        problems.extend(msg for name, msg in requires_problems(order) if name == patch.name)
    return problems


def lint_engine(
    root: Path, engine: str, *, offline: bool = False, reporter: Reporter | None = None
) -> LintReport:
    from overlay.core.fetch import fetch_artifact
    from overlay.core.series import load_engine_series
    from overlay.core.wheels import read_wheel

    reporter = reporter or NullReporter()
    problems: list[Problem] = []
    try:
        manifest: Manifest = load_engine(root, engine)
        series: Series = load_engine_series(root, manifest)
    except ConfigError as exc:
        return LintReport(
            engine=engine, patches=0, problems=(Problem(engine, None, exc.message, "config", exc.tip),)
        )
    problems.extend(static_problems(root, manifest, series))
    for patch in series.patches:
        for path, what in patch_problems(patch, package_root=manifest.upstream.package_root):
            problems.append(
                Problem(
                    engine,
                    patch.name,
                    f"path {path!r} {what}",
                    "integrity",
                    "drop that file from the patch, then `overlay refresh`",
                )
            )
    reporter.step(
        "lint", f"{engine}: {len(series.patches)} patches, checking they apply at {manifest.upstream.version}"
    )
    artifact = manifest.upstream.primary
    if artifact.is_wheel:
        try:
            tree = read_wheel(
                fetch_artifact(root, manifest, artifact, offline=offline, reporter=reporter),
                policy=MemberPolicy.of(manifest.upstream.allow_members),
            ).tree
            for patch in series.patches:
                apply_patch(tree, patch, package_root=manifest.upstream.package_root)
        except PatchError as exc:
            problems.append(
                Problem(engine, None, exc.message, "apply", "refresh the patch (see `overlay checkout`)")
            )
        except IntegrityError as exc:
            problems.append(Problem(engine, None, exc.message, "integrity", exc.tip))
        except OverlayError as exc:
            problems.append(Problem(engine, None, exc.message, "config", exc.tip))
    else:
        reporter.step("lint", f"{engine}: sdist pin; exact apply is checked by `overlay apply`")
    return LintReport(
        engine=engine,
        patches=len(series.patches),
        problems=tuple(problems),
        warnings=unresolved_checks(root, series.patches) + hotspot_warnings(series.patches, engine=engine),
    )


@dataclass(frozen=True)
class Hotspot:
    path: str
    first: int  # upstream (pinned tree) line numbers of the region, context included
    last: int
    patches: tuple[str, ...]


HOTSPOT_SHARE = 1 / 3  # a region touched by more than this share of the series' patches is a hotspot
HOTSPOT_MIN = 3  # and by at least this many patches


def merge_hotspots(patches: Sequence[Patch]) -> list[Hotspot]:
    """Regions of upstream files that more than a third of the series' patches change, at least three of them: one
    upstream change there conflicts every one of those patches in the next rebase.

    Each hunk's changed lines (not its context) are mapped back to the pinned tree's line numbers through the patches
    before it, and widened by one line each side (git's merge conflicts on adjacent changes too); a hotspot is a run
    of lines that many patches' changes cover at once."""
    applied: dict[
        str, list[list[tuple[int, int, int]]]
    ] = {}  # path -> per earlier patch: (new_start, new_len, old_len)
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for patch in patches:
        mine: dict[str, list[tuple[int, int, int]]] = {}
        for fd in patch.files:
            if fd.kind == "add" or not fd.old_path:
                continue
            path = fd.old_path
            for h in fd.hunks:
                lo, hi = _changed_range(h)
                first = _to_upstream(applied.get(path, []), lo)
                last = _to_upstream(applied.get(path, []), hi)
                spans.setdefault(path, []).append((first - 1, max(first, last) + 1, patch.name))
                mine.setdefault(fd.new_path or path, []).append((h.new_start, h.new_len, h.old_len))
        for path, hunks in mine.items():
            applied.setdefault(path, []).append(hunks)
    limit = max(HOTSPOT_MIN, int(len(patches) * HOTSPOT_SHARE) + 1)
    out: list[Hotspot] = []
    for path, items in spans.items():
        current: tuple[int, int, list[str]] | None = None
        for x in sorted({a for a, _b, _n in items}):
            names = list(dict.fromkeys(n for a, b, n in items if a <= x <= b))
            if len(names) < limit:
                continue
            covering = [(a, b) for a, b, n in items if a <= x <= b]
            lo, hi = min(a for a, _b in covering), max(b for _a, b in covering)
            if current is not None and lo <= current[1]:
                current = (current[0], max(current[1], hi), list(dict.fromkeys(current[2] + names)))
            else:
                if current is not None:
                    out.append(Hotspot(path, max(current[0], 1), current[1], tuple(current[2])))
                current = (lo, hi, names)
        if current is not None:
            out.append(Hotspot(path, max(current[0], 1), current[1], tuple(current[2])))
    return out


def _changed_range(h: Hunk) -> tuple[int, int]:
    """The pre-image lines a hunk's changes sit on (an insertion: the lines either side of it)."""
    pos = h.old_start if h.old_len else h.old_start + 1
    lo: int | None = None
    hi = pos
    for line in h.lines:
        if line.op == "-":
            lo = pos if lo is None else lo
            hi = pos
        elif line.op == "+":
            lo = pos - 1 if lo is None else lo
            hi = max(hi, pos - 1)
        if line.op != "+":
            pos += 1
    return (lo if lo is not None else h.old_start), hi


def _to_upstream(earlier: list[list[tuple[int, int, int]]], line: int) -> int:
    """A line of the tree with ``earlier`` patches applied, mapped back to the pinned tree (a line an earlier patch
    added maps to where that hunk starts)."""
    for hunks in reversed(earlier):
        shift = 0
        mapped: int | None = None
        for new_start, new_len, old_len in hunks:
            if line >= new_start + new_len:
                shift += new_len - old_len
                continue
            if line >= new_start:
                mapped = new_start - shift + min(line - new_start, max(old_len - 1, 0))
            break
        line = mapped if mapped is not None else line - shift
    return line


def hotspot_warnings(patches: Sequence[Patch], *, engine: str) -> tuple[str, ...]:
    return tuple(
        f"merge hotspot: {len(h.patches)} of the {len(patches)} patches touch {h.path} lines {h.first}-{h.last} "
        f"({', '.join(n[:4] for n in h.patches)}); one upstream change there conflicts them all in a rebase: move "
        "what they add there apart (one patch that declares it all, or each beside the code it gates)"
        for h in merge_hotspots(patches)
    )


def static_problems(root: Path, manifest: Manifest, series: Series) -> list[Problem]:
    """Lint's static checks (numbering order, trailers, Overlay-Check targets): no artifact needed. `overlay apply`
    refuses a series with any of these unless --allow-unlinted."""
    engine = manifest.name
    problems: list[Problem] = []
    previous = 0
    for patch in series.patches:
        if patch.number <= previous:
            problems.append(
                Problem(
                    engine,
                    patch.name,
                    f"number {patch.number:04d} does not follow {previous:04d}",
                    "config",
                    f"run `overlay refresh {engine}` to renumber",
                )
            )
        previous = patch.number
        for msg in lint_patch_metadata(root, patch, engine=engine, series=series.patches):
            problems.append(Problem(engine, patch.name, msg, "metadata", _metadata_tip(msg)))
    return problems


def _metadata_tip(message: str) -> str | None:
    if message.startswith("Overlay-Requires") and ("comes after it" in message or "no such patch" in message):
        return (
            "put the required patch back before this one (`overlay checkout`, `git rebase -i` there, `overlay "
            "refresh`), or remove the Overlay-Requires line if the patch no longer needs it"
        )
    if message.startswith(
        ("missing trailer Overlay-Flag", "Overlay-Flag", "Overlay-Mechanism", "Overlay-Requires")
    ) or (message.startswith("Overlay-Theme") and "Overlay-Mechanism" in message):
        return (
            "fix the trailer in the commit message (git commit --amend / rebase -i reword), then `overlay refresh`; "
            "the words are in docs/dev/patch-authoring.md (Overlay-Flag, Overlay-Mechanism, Overlay-Requires)"
        )
    if message.startswith("missing trailer"):
        return (
            "add the four trailers at the end of the commit message (Overlay-Theme, Overlay-Numerics, "
            "Overlay-Check, Upstream-Status), then `overlay refresh`; see docs/dev/patch-authoring.md"
        )
    if "no body" in message:
        return "reword the commit (git commit --amend / rebase -i reword), then `overlay refresh`"
    return None
