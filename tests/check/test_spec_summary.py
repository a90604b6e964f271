"""Acceptance counters of `overlay check`'s speculative runs: exact engine counters vs the from_draft estimate."""

from __future__ import annotations

from overlay.check.measures import spec_summary

# Two prompts, k = 3: cycles accept 3, 1, 0 drafts (+ one target token each); the engine saw the last cycle of the
# second prompt draft only 2 tokens (max_tokens reached), which the flag estimate cannot know.
FLAGS = [[1, 1, 1, 0, 1, 0], [0]]
STATS = [{"accepted": 4, "drafted": 6, "cycles": 2}, {"accepted": 0, "drafted": 2, "cycles": 1}]


def test_flags_estimate_without_engine_counters() -> None:
    s = spec_summary({"results": [{"from_draft": f} for f in FLAGS]}, 3)
    assert (s["accepted"], s["cycles"], s["drafted"]) == (4, 3, 9)
    assert s["counters"].startswith("derived") and "engine" not in s
    assert s["acceptance_length"] == (4 + 3) / 3


def test_engine_counters_kept_and_used_only_when_asked() -> None:
    run = {"results": [{"from_draft": f, "stats": st} for f, st in zip(FLAGS, STATS)]}
    exact = spec_summary(run, 3)
    assert exact["counters"] == "engine" and (exact["accepted"], exact["drafted"], exact["cycles"]) == (
        4,
        8,
        3,
    )
    assert exact["acceptance_rate"] == 0.5
    # Compared with an arm that has no counters: both from the flags, the engine's kept beside them.
    like = spec_summary(run, 3, engine_counters=False)
    assert like["counters"].startswith("derived") and (like["drafted"], like["acceptance_rate"]) == (9, 4 / 9)
    assert like["engine"]["drafted"] == 8


def test_partial_engine_counters_fall_back_to_flags() -> None:
    run = {"results": [{"from_draft": FLAGS[0], "stats": STATS[0]}, {"from_draft": FLAGS[1]}]}
    s = spec_summary(run, 3)
    assert s["counters"].startswith("derived") and "engine" not in s
