"""What one `overlay check ENGINE` run is asked to do (CheckOptions) and the numerics classes it gates on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from overlay.check import census as census_mod
from overlay.core.series import Patch

REPORT_VERSION = 2  # 2: speed verdicts with a paired log-ratio interval, host facts, flags, inputs
CLASS_ORDER = {"exact": 0, "lossless": 1, "approximate": 2}
MIN_SPEED_GATE_REPS = 5  # a speed gate's interval needs at least this many paired repetitions


@dataclass(frozen=True)
class CheckOptions:
    engine: str
    model: Path | None = None
    draft: Path | None = None
    per_patch: bool = False
    reps: int = 5
    positions: int = 50_000
    seq_len: int = 256
    max_tokens: int = 48
    num_draft: int = 3
    decode_tokens: int = 128
    json_path: Path | None = None
    html_path: Path | None = None
    min_speedup: float | None = None
    allow_few_positions: bool = False
    target_kind: str | None = None
    draft_kind: str | None = None
    mechanism: bool = False  # run the mechanism census alone
    # a declared mechanism that does not hold fails the check (default on; False: reported, not gated)
    gate_mechanism: bool | None = None
    patch: str | None = None  # census only this patch's mechanisms
    census_steps: int = census_mod.DEFAULT_STEPS
    flags: str = "none"  # "all", "none" or a comma-separated list of flag names (overlay.check.flags)
    prompts_file: Path | None = None  # JSONL: {"text": ...} or {"messages": [...]}, optional "category"
    corpus_file: Path | None = None  # the teacher-forced pass's text (plain text or JSONL {"text": ...})
    temperature: float = 0.0  # > 0: also the sampling-distribution check at this temperature
    samples: int = 200  # seeds per prompt for the sampling-distribution check
    sample_positions: int = 8  # token positions compared per prompt
    stock_wheel: Path | None = None  # check this stock artifact instead of the pinned one
    patched_wheel: Path | None = None  # check this patched wheel instead of building one

    @property
    def mechanism_gated(self) -> bool:
        return True if self.gate_mechanism is None else self.gate_mechanism


def series_class(patches: Sequence[Patch]) -> str:
    """The weakest numerics class of a set of patches (exact < lossless < approximate); "exact" for none."""
    classes = [p.numerics or "approximate" for p in patches]
    return max(classes, key=lambda c: CLASS_ORDER.get(c, 2)) if classes else "exact"
