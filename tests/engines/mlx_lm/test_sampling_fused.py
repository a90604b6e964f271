"""Samplers: stock vs patched on the same log-probabilities.

- The compiled sampler chain must draw the same tokens as stock under the same seed (same random stream).
- Top-k candidate preselection (opt-in) draws from the same distribution over the same allowed tokens, but not the
  same stream, so it is checked against the exact distribution of the stock filter chain; its top-p candidate cap
  falls back to the full chain (then the stream is stock's again) when the candidates miss the top-p mass.
One probe process per arm (probes/sampling_probe.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

PROBE = Path(__file__).parent / "probes" / "sampling_probe.py"

CHAIN = {"temp": 0.7, "top_p": 0.9, "min_p": 0.05, "top_k": 40}
STREAM_CONFIGS = {
    "chain": CHAIN,
    "min_p": {"temp": 0.7, "min_p": 0.05},
    "top_p": {"temp": 1.0, "top_p": 0.95},
    "top_k": {"temp": 0.6, "top_k": 20},
    "xtc": {"temp": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.1, "top_p": 0.9},
}
PRESELECT = {"MLX_LM_TOPK_PRESELECT": "1"}
CANDIDATES = {"MLX_LM_TOPP_CANDIDATES": "64"}


def _streams() -> list[dict[str, Any]]:
    cases = [
        {"id": f"{name}@512", "vocab": 512, "scale": 4.0, "config": cfg, "draws": 200, "seed": 7}
        for name, cfg in STREAM_CONFIGS.items()
    ]
    cases += [
        {
            "id": f"{name}@32768",
            "vocab": 32768,
            "scale": 4.0,
            "config": STREAM_CONFIGS[name],
            "draws": 100,
            "seed": 8,
        }
        for name in ("chain", "xtc")
    ]
    cases.append(
        {"id": "chain@151936", "vocab": 151936, "scale": 4.0, "config": CHAIN, "draws": 30, "seed": 9}
    )
    return cases


def _patched_streams() -> list[dict[str, Any]]:
    # Flat log-probabilities: 64 candidates cannot reach top_p = 0.9, so the capped sampler must fall back.
    return [
        {
            "id": "capped-fallback@512",
            "vocab": 512,
            "scale": 0.1,
            "config": {"temp": 0.7, "top_p": 0.9},
            "env": CANDIDATES,
            "draws": 200,
            "seed": 11,
        }
    ]


def _dists(env: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "id": "chain@512",
            "vocab": 512,
            "scale": 4.0,
            "config": CHAIN,
            "env": env,
            "rows": 5000,
            "calls": 4,
            "seed": 3,
        },
        {
            "id": "chain-flat@512",
            "vocab": 512,
            "scale": 1.0,
            "config": CHAIN,
            "env": env,
            "rows": 5000,
            "calls": 4,
            "seed": 4,
        },
        {
            "id": "top_k@512",
            "vocab": 512,
            "scale": 2.0,
            "config": {"temp": 1.0, "top_k": 10},
            "env": env,
            "rows": 5000,
            "calls": 4,
            "seed": 5,
        },
        {
            "id": "chain@8192",
            "vocab": 8192,
            "scale": 4.0,
            "config": CHAIN,
            "env": env,
            "rows": 1000,
            "calls": 4,
            "seed": 6,
        },
        {
            "id": "capped@512",
            "vocab": 512,
            "scale": 4.0,
            "config": {"temp": 0.7, "top_p": 0.9},
            "env": CANDIDATES,
            "rows": 5000,
            "calls": 4,
            "seed": 12,
        },
    ]


@pytest.fixture(scope="module")
def results(arms: Any) -> dict[str, Any]:
    fallback = _patched_streams()
    stock = arms.stock.run_json(PROBE, {"streams": _streams() + fallback, "dists": _dists({})})
    patched = arms.patched.run_json(PROBE, {"streams": _streams() + fallback, "dists": _dists(PRESELECT)})
    small = [c for c in _streams() if c["vocab"] == 512]
    off = arms.patched.run_json(PROBE, {"streams": small}, extra_env={"MLX_LM_FUSED_SAMPLER": "0"})
    return {"stock": stock, "patched": patched, "off": off}


def _tv(hist: dict[int, int], exact: dict[int, float]) -> float:
    n = sum(hist.values())
    keys = set(hist) | set(exact)
    return 0.5 * sum(abs(hist.get(k, 0) / n - exact.get(k, 0.0)) for k in keys)


def test_fused_sampler_chain_same_stream(results: dict[str, Any]) -> None:
    """P: one compiled sampler chain: the same tokens as stock under the same seed, every config and vocabulary."""
    s, p = results["stock"]["streams"], results["patched"]["streams"]
    for case_id, sc in s.items():
        assert sc["tokens"] == p[case_id]["tokens"], f"{case_id}: token stream differs from stock"
        assert len(set(sc["tokens"])) > 1, f"{case_id}: degenerate case (one token)"
    for case_id, sc in s.items():
        if "primitives" in sc:
            assert p[case_id]["primitives"] <= sc["primitives"], case_id
    # MLX_LM_FUSED_SAMPLER=0: the uncompiled chain, stock's graph and stream.
    for case_id, oc in results["off"]["streams"].items():
        assert oc["tokens"] == s[case_id]["tokens"], case_id
        if "primitives" in oc:
            assert oc["primitives"] == s[case_id]["primitives"], case_id


def test_topk_preselect_same_distribution(results: dict[str, Any]) -> None:
    """P: top-k candidate preselection: same allowed tokens, same distribution (not the same stream)."""
    s, p = results["stock"]["dists"], results["patched"]["dists"]
    for case_id, sd in s.items():
        pd_ = p[case_id]
        exact = {int(k): v for k, v in sd["exact"].items()}
        assert {int(k): v for k, v in pd_["exact"].items()} == exact
        n = sum(pd_["hist"].values())
        drawn = {int(k): c for k, c in pd_["hist"].items()}
        assert pd_["hist"] != sd["hist"], (
            f"{case_id}: the patched draws are stock's: preselection did not run"
        )
        assert set(drawn) <= set(exact), (
            f"{case_id}: drew tokens outside the allowed set {set(drawn) - set(exact)}"
        )
        frequent = {k for k, v in exact.items() if v * n >= 20}
        assert frequent <= set(drawn), f"{case_id}: allowed tokens never drawn: {frequent - set(drawn)}"
        tv_patched = _tv(drawn, exact)
        tv_stock = _tv({int(k): c for k, c in sd["hist"].items()}, exact)
        # Sampling noise of n draws over len(exact) tokens is ~ sqrt(len/(2 pi n)); both arms must sit at that floor.
        floor = 3 * np.sqrt(len(exact) / (2 * np.pi * n)) + 0.01
        assert tv_stock <= floor, f"{case_id}: stock itself is off the exact distribution ({tv_stock:.3f})"
        assert tv_patched <= floor, (
            f"{case_id}: TV distance {tv_patched:.3f} > {floor:.3f} (stock {tv_stock:.3f})"
        )


def test_topp_candidates_fall_back_exactly(results: dict[str, Any]) -> None:
    """P: with a top-p candidate cap that misses the top-p mass, the sampler is stock's full chain (same stream)."""
    s, p = results["stock"]["streams"], results["patched"]["streams"]
    assert s["capped-fallback@512"]["tokens"] == p["capped-fallback@512"]["tokens"]
