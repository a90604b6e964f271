"""The SGLang census hook's pure part (src/overlay/engines/workers/sglang_census_hook.py ``split_by_zone``): the
draft-extend-draft scenario's capture violations split into the graph runners' captured forwards and the host-side
preparation around them. The engine run itself: tests/census/test_sglang_census.py (long)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parents[2] / "src" / "overlay" / "engines" / "workers"
sys.path.insert(0, str(WORKERS))
_spec = importlib.util.spec_from_file_location("sglang_census_hook", WORKERS / "sglang_census_hook.py")
assert _spec is not None and _spec.loader is not None
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)


def test_split_by_zone_sides_and_per_step_means() -> None:
    sync = "host sync (aten._local_scalar_dense) at sglang/srt/a.py:1"
    copy = "pageable H2D copy (copy_) at sglang/srt/b.py:2"
    violations = [sync, copy, sync, copy, sync]
    zones = [
        "outside:IntelAMXAttnBackend.init_forward_metadata",
        "graph:draft-model-forward",
        "outside:IntelAMXAttnBackend.init_forward_metadata",
        "graph:draft-model-forward",
        "graph:draft_forward",
    ]
    split = hook.split_by_zone(violations, zones, 2)
    assert split == {
        "graph": {"graph:draft-model-forward": {copy: 1.0}, "graph:draft_forward": {sync: 0.5}},
        "outside": {"outside:IntelAMXAttnBackend.init_forward_metadata": {sync: 1.0}},
    }
    assert set(hook.GRAPH_ZONES) == {"graph:draft_forward", "graph:draft-model-forward"}


def test_split_by_zone_refuses_unlabelled_violations() -> None:
    with pytest.raises(ValueError, match="2 violations but 1 zone labels"):
        hook.split_by_zone(["a at x:1", "b at y:2"], ["outside:worker"], 1)
    assert hook.split_by_zone([], [], 0) == {"graph": {}, "outside": {}}


def test_zone_label_keeps_the_path_under_a_graph_zone() -> None:
    runner = "outside:ModelRunner.forward"
    assert (
        hook.zone_label(["outside:draft", "graph:draft_forward", runner]) == f"graph:draft_forward > {runner}"
    )
    assert hook.zone_label(["outside:_draft_extend_for_decode", runner, "graph:draft-model-forward"]) == (
        "graph:draft-model-forward"
    )
    assert hook.zone_label(["outside:_draft_extend_for_decode", runner]) == runner
    assert hook.zone_label([]) == hook.OUTSIDE
    nested = f"graph:draft_forward > {runner}"
    split = hook.split_by_zone(["a at x.py:1"], [nested], 1)
    assert split == {"graph": {nested: {"a at x.py:1": 1.0}}, "outside": {}}
