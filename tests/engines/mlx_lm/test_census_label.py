"""The mlx-lm census's Metal label (MlxLmAdapter.census_label): which part of a counted change a Metal build would see,
and the warning when the estimate comes from compiled functions that hold fast calls (their CPU fallbacks cannot be
collapsed there: an add + RMSNorm compiled is 2 Metal kernels, estimated 5; docs/engines/mlx-lm.md)."""

from __future__ import annotations

from typing import Any

from overlay.engines.mlx_lm import MlxLmAdapter


def _run(cpu: float, metal: float, compiled_fast: float = 0.0) -> dict[str, Any]:
    return {
        "metrics": {"ops-per-token": cpu},
        "detail": {"metal-ops-per-token": metal, "compiled-fast-calls-per-token": compiled_fast},
    }


def test_cpu_only_decrease_names_the_over_count_of_compiled_fast_calls() -> None:
    label = MlxLmAdapter().census_label("ops-per-token", _run(295, 111), _run(281, 119, compiled_fast=2))
    assert label is not None
    assert label.startswith("CPU-only") and "111 -> 119" in label and "over-counted" in label


def test_plain_labels() -> None:
    adapter = MlxLmAdapter()
    assert "over-counted" not in (adapter.census_label("ops-per-token", _run(295, 111), _run(281, 111)) or "")
    assert (adapter.census_label("ops-per-token", _run(214, 168), _run(194, 148)) or "").startswith(
        "Metal would also see it"
    )
    assert (adapter.census_label("host-syncs", _run(1, 1), _run(1, 1)) or "").startswith(
        "backend-independent"
    )
    assert adapter.census_label("peak-memory", _run(1, 1), _run(1, 1)) is None
