"""Cache snapshots survive in-place writes (patch generate: speculative decoding for hybrid ArraysCache targets).

``snapshot_prompt_cache`` kept references to a ``RotatingKVCache``'s key/value buffers, and a single-token update
of a full window writes those same array objects in place (``keys[..., idx, :] = ...``), so restoring the snapshot
brought back the later tokens: a hybrid drafter with sliding-window layers, which is snapshotted before every
draft step, was rolled back to a corrupted window. The snapshot now holds its own views of the buffers.
Probe: probes/spec_run.py ``rollback_unit`` (snapshots before each of 4 single-token steps, restore the one before
step 2, compare with a cache that only saw the first 2 steps): qwen3 with ``max_kv_size`` 8 and 16 and gemma3 (its
own sliding layers, window 12), prompts of 8, 20 and 40 tokens that wrap the windows; unbounded qwen3 and the hybrid
Qwen3.5 as controls.
"""

from __future__ import annotations

from test_spec_stats import RUN, spec_prompts

from overlay.check.envs import Arms


def test_rotating_snapshot_restores_its_own_window(arms: Arms, models: dict[str, str]) -> None:
    prompts = spec_prompts()
    setups = [("qwen3", 8), ("qwen3", 16), ("gemma", None), ("hybrid", None), ("qwen3", None)]
    cases = [
        {
            "id": f"{name}/{window}",
            "api": "rollback_unit",
            "target": models[name],
            "prompts": prompts,
            "max_kv_size": window,
        }
        for name, window in setups
    ]
    res = arms.patched.run_json(RUN, {"cases": cases})["cases"]
    for case in cases:
        out = res[case["id"]]
        assert "error" not in out, out
        for run in out["runs"]:
            assert run["restored_offset"] == run["reference_offset"], case["id"]
            assert run["max_abs_diff"] == 0.0, (
                f"{case['id']}: the restored cache differs by {run['max_abs_diff']}"
            )
