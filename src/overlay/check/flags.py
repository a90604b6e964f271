"""`overlay check ENGINE --flags all|none|NAME,...`: which patches' ``Overlay-Flag`` values the patched arm runs with.

A patch is *active* in the patched arm when every flag it declares is on: a `default` patch (or one without the
trailer) always is; an opt-in patch (``ENV=VALUE`` or a ``--cli-option``) only when its flags are selected. The gate
class is the weakest numerics class of the active patches the comparisons exercise: with its flags off, an opt-in
patch's code is in the wheel but does not run, so it does not loosen the gate of the patches that do.

Environment flags are set in the patched arm's processes. CLI options are passed to each task request as
``options`` (the engine's Python API takes no CLI); the engine's worker turns those its generating tasks take into
keyword arguments (``reached``: asked of the patched arm before the comparisons, through the adapter's
``option_reach``). A patch turned on by a CLI option no comparison task takes is active but not *exercised*: listed
as such, and not counted in the gate class.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from overlay.core.mechanism import Flag
from overlay.core.series import Patch
from overlay.errors import UsageError


@dataclass(frozen=True)
class FlagChoice:
    """The flags a check sets, and what follows for each patch."""

    requested: str  # the --flags text
    selected: tuple[Flag, ...]  # the opt-in flags set in the patched arm
    active: tuple[Patch, ...]  # patches whose every flag is on (default patches included)
    inactive: tuple[Patch, ...]  # opt-in patches left off
    reached: frozenset[str] = frozenset()  # the CLI options the output and speed comparisons' tasks apply

    @property
    def exercised(self) -> tuple[Patch, ...]:
        """Active patches the output and speed comparisons run: every opt-in flag of theirs is an environment
        variable or a CLI option those tasks apply (``reached``). The gate class comes from these."""
        return tuple(
            p
            for p in self.active
            if all(f.kind in ("env", "default") or f.name in self.reached for f in p.flags)
        )

    @property
    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for f in self.selected:
            out.update(f.environ)
        return out

    @property
    def options(self) -> dict[str, str | None]:
        return {f.name: f.value for f in self.selected if f.kind == "cli"}

    def report(self) -> dict[str, Any]:
        exercised = set(self.exercised)
        not_exercised: list[dict[str, Any]] = [
            {
                "patch": p.name,
                "flags": [f.text for f in p.flags if f.kind != "default"],
                "why": "flag off in this run (--flags)",
            }
            for p in self.inactive
        ]
        not_exercised += [
            {
                "patch": p.name,
                "flags": [f.text for f in p.flags if f.kind == "cli" and f.name not in self.reached],
                "why": "a CLI option none of the comparison tasks (greedy, speculative, sampling, speed) "
                "takes: only the census ran with it (not counted in the gate class)",
            }
            for p in self.active
            if p not in exercised
        ]
        out: dict[str, Any] = {
            "requested": self.requested,
            "set": [f.text for f in self.selected],
            "environment": self.env,
            "options": self.options,
            "options_reached": sorted(self.reached),
            "active_patches": [p.name for p in self.active],
            "exercised_patches": [p.name for p in self.exercised],
            "inactive_patches": [p.name for p in self.inactive],
            "not_exercised": not_exercised,
        }
        return out


def opt_in_flags(patches: Sequence[Patch]) -> list[Flag]:
    """Every distinct non-default flag the patches declare, in series order."""
    seen: dict[str, Flag] = {}
    for p in patches:
        for f in p.flags:
            if f.kind != "default":
                seen.setdefault(f.text, f)
    return list(seen.values())


def _names(flag: Flag) -> set[str]:
    """The spellings `--flags` accepts for ``flag``: NAME, NAME=VALUE; --opt, opt, --opt=VALUE."""
    out = {flag.text, flag.name}
    if flag.kind == "cli":
        out.add(flag.name.lstrip("-"))
    return out


def choose(patches: Sequence[Patch], requested: str, *, engine: str) -> FlagChoice:
    """Resolve ``--flags``: "all", "none" (the default) or a comma-separated list of flag names."""
    known = opt_in_flags(patches)
    text = (requested or "none").strip()
    if text == "all":
        selected = known
    elif text == "none":
        selected = []
    else:
        selected = []
        for word in (w.strip() for w in text.split(",")):
            if not word:
                raise UsageError(
                    f"--flags {requested!r} has an empty name", tip="write NAME,NAME (no spaces needed)"
                )
            hits = [f for f in known if word in _names(f)]
            if not hits:
                spellings = sorted({n for f in known for n in (f.name,)})
                close = difflib.get_close_matches(word, spellings, n=1)
                raise UsageError(
                    f"--flags: {word!r} is not an Overlay-Flag of the {engine} series"
                    + (f" (did you mean {close[0]!r}?)" if close else ""),
                    tip=("flags: " + ", ".join(f.text for f in known) + "; or `all` / `none`")
                    if known
                    else f"the {engine} series declares no opt-in flag: use --flags none",
                )
            for f in hits:
                if f not in selected:
                    selected.append(f)
    chosen = {f.text for f in selected}
    active: list[Patch] = []
    inactive: list[Patch] = []
    for p in patches:
        opt = [f for f in p.flags if f.kind != "default"]
        (active if all(f.text in chosen for f in opt) else inactive).append(p)
    return FlagChoice(
        requested=text, selected=tuple(selected), active=tuple(active), inactive=tuple(inactive)
    )
