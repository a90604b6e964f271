"""Self-tests of the torch census (src/overlay/engines/workers/torch_census.py) with real torch.

The census runs inside an engine arm (CPU torch 2.13 from the ExLlamaV3 runtime requirements); probes/census_cases.py
runs each counted construct alone in one census step and reports the census's counts and call sites. Every test
compares with the construct's own line, so a site pointing into torch or into the census fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arm, arms_for

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "probes" / "census_cases.py"


@pytest.fixture(scope="module")
def cases() -> dict[str, Any]:
    arm: Arm = arms_for(REPO, "exllamav3").stock
    return dict(arm.run_json(PROBE, {"cases": []}, extra_env={"OVERLAY_EXL3_STANDIN": "0"}))


def _metrics(cases: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(cases[name]["report"]["metrics"])


def _sites(cases: dict[str, Any], name: str, metric: str) -> list[list[Any]]:
    return list(cases[name]["report"]["sites"].get(metric, []))


HOST_READS = [
    "item",
    "int",
    "bool",
    "if",
    "tolist",
    "cpu",
    "to_cpu",
    "numpy",
    "nonzero",
    "equal",
    "masked_select",
    "unique",
    "bool_mask_index",
    "bool_mask_put_tensor",
    "synchronize",
    "event_sync",
    "stream_sync",
]


@pytest.mark.parametrize("name", HOST_READS)
def test_each_host_sync_is_counted_once_at_its_line(cases: dict[str, Any], name: str) -> None:
    assert _metrics(cases, name)["host-syncs"] == 1.0
    assert _sites(cases, name, "host-syncs") == [[cases[name]["line"], 1]]


@pytest.mark.parametrize(
    "name", ["to_cpu_async", "int_index", "host_item", "tensor_host", "view", "add", "bool_mask_fill"]
)
def test_what_is_not_a_host_sync(cases: dict[str, Any], name: str) -> None:
    # an async D2H copy, integer indexing, a read of host data, host data made from Python, views and elementwise ops;
    # x[mask] = scalar (ATen runs it as masked_fill_: no mask count is read back, unlike x[mask] = a device tensor)
    assert _metrics(cases, name)["host-syncs"] == 0.0


def test_a_tensor_if_is_an_implicit_sync(cases: dict[str, Any]) -> None:
    # the _devsim counter missed these: no Python method is called, only aten._local_scalar_dense
    assert cases["if"]["report"]["kinds"] == {"host-syncs:aten._local_scalar_dense": 1}


def test_pageable_and_pinned_h2d(cases: dict[str, Any]) -> None:
    for name in ("h2d_pageable", "h2d_pinned", "h2d_pin_method", "h2d_blocking", "tensor_device"):
        assert _metrics(cases, name)["h2d-copies"] == 1.0, name
        assert _sites(cases, name, "h2d-copies") == [[cases[name]["line"], 1]], name
    assert _metrics(cases, "h2d_pageable")["pageable-copies"] == 1.0
    assert _metrics(cases, "tensor_device")["pageable-copies"] == 1.0
    for name in ("h2d_pinned", "h2d_pin_method", "h2d_blocking"):
        assert _metrics(cases, name)["pageable-copies"] == 0.0, name
    # a non_blocking copy does not wait; a blocking one (and torch.tensor(..., device=)) waits for the stream
    assert _metrics(cases, "h2d_pinned")["host-syncs"] == 0.0
    assert _metrics(cases, "h2d_blocking")["host-syncs"] == 1.0
    assert _metrics(cases, "tensor_device")["host-syncs"] == 1.0
    assert _metrics(cases, "h2d_pinned")["bytes-moved"] == 24.0


def test_views_are_not_launches_and_ops_are(cases: dict[str, Any]) -> None:
    assert _metrics(cases, "view")["eager-launches"] == 0.0
    assert _metrics(cases, "views")["eager-launches"] == 0.0
    assert _metrics(cases, "add")["eager-launches"] == 1.0
    assert _sites(cases, "add", "eager-launches") == [[cases["add"]["line"], 1]]
    assert _metrics(cases, "tensor_host")["eager-launches"] == 0.0  # host work is not a device launch


def test_random_elements_count_the_numbers_drawn(cases: dict[str, Any]) -> None:
    for name, drawn in (("random_in_place", 6), ("random_factory", 6), ("random_generator", 4)):
        assert _metrics(cases, name)["random-elements"] == float(drawn), name
        assert _sites(cases, name, "random-elements") == [[cases[name]["line"], drawn]], name
    assert _metrics(cases, "sort")["random-elements"] == 0.0
    assert _metrics(cases, "allocation")["random-elements"] == 0.0  # an empty tensor draws nothing


def test_an_expanded_op_counts_the_ops_its_kernel_runs(cases: dict[str, Any]) -> None:
    """multinomial's kernel (torch 2.13, no replacement) checks its weights on the device, then runs the exponential
    race: the dispatch mode sees one op; ``expand`` counts the kernel's own aten ops (its _assert_async's .item() is
    a device-side assert on CUDA, not a host read)."""
    plain, expanded = _metrics(cases, "multinomial"), _metrics(cases, "multinomial_expanded")
    # the line's torch.ones is one launch in both; multinomial is 1 launch, expanded 13
    assert plain["eager-launches"] == 2.0 and plain["random-elements"] == 2.0  # the two sampled indices
    assert expanded["eager-launches"] == 14.0 and expanded["host-syncs"] == 0.0
    assert expanded["random-elements"] == 6.0  # the Exp(1) noise over the 2 x 3 weights
    kinds = cases["multinomial_expanded"]["report"]["kinds"]
    assert kinds["eager-launches:aten._assert_async"] == 2 and kinds["eager-launches:aten.exponential_"] == 1
    assert kinds["expanded:aten.multinomial"] == 1
    line = cases["multinomial_expanded"]["line"]
    assert _sites(cases, "multinomial_expanded", "eager-launches") == [[line, 14]]


def test_sort_elements_count_the_elements_of_full_sorts(cases: dict[str, Any]) -> None:
    assert _metrics(cases, "sort")["sort-elements"] == 6.0  # the case's tensor x: 6 elements
    assert _sites(cases, "sort", "sort-elements") == [[cases["sort"]["line"], 6]]
    assert _metrics(cases, "argsort")["sort-elements"] == 6.0  # argsort is a sort
    assert _metrics(cases, "topk")["sort-elements"] == 0.0  # a selection, not a sort
    assert _metrics(cases, "topk")["eager-launches"] == 1.0
    assert _metrics(cases, "add")["sort-elements"] == 0.0


def test_gemm_bytes_count_the_operands_of_matrix_multiplies(cases: dict[str, Any]) -> None:
    assert _metrics(cases, "matmul")["gemm-bytes"] == 48.0  # two fp32 [2, 3] / [3, 2] operands: 2 x 24 B
    assert _sites(cases, "matmul", "gemm-bytes") == [[cases["matmul"]["line"], 48]]
    # F.linear reaches dispatch as a matrix multiply: a [1, 6] bf16 activation and a [4, 6] bf16 weight
    assert _metrics(cases, "linear_bf16")["gemm-bytes"] == 2.0 * (6 + 24)
    assert _sites(cases, "linear_bf16", "gemm-bytes") == [[cases["linear_bf16"]["line"], 60]]
    # the FP8 GEMM: two [16, 32] e4m3 operands (1 B each) and two fp32 scales; half a bf16 weight's bytes
    assert _metrics(cases, "scaled_mm")["gemm-bytes"] == 2.0 * 16 * 32 + 2 * 4
    assert _metrics(cases, "add")["gemm-bytes"] == 0.0
    assert _metrics(cases, "topk")["gemm-bytes"] == 0.0


def test_reshape_of_a_copy_is_one_launch(cases: dict[str, Any]) -> None:
    # reshape of a non-contiguous tensor dispatches clone, then _unsafe_view (not tagged a view, yet an alias)
    m = _metrics(cases, "reshape_copy")
    assert cases["reshape_copy"]["report"]["kinds"] == {"eager-launches:aten.clone": 1}
    assert (m["eager-launches"], m["alloc-bytes"]) == (1.0, 24.0)


def test_is_cuda_slice_assignment_is_a_device_copy(cases: dict[str, Any]) -> None:
    """placement="is_cuda": ``out[0::2] = y`` with out and y device tensors writes through a view ATen makes in C++
    (a plain Tensor, not the is_cuda subclass): one copy kernel on the device, no host read, nothing moved."""
    for name, writes in (("is_cuda_setitem_slice", 1), ("is_cuda_setitem_made", 5)):
        m = _metrics(cases, name)
        assert (m["host-syncs"], m["bytes-moved"], m["h2d-copies"]) == (0.0, 0.0, 0.0), name
        assert cases[name]["report"]["kinds"]["eager-launches:aten.copy_"] == writes, name
        assert [cases[name]["line"], writes] in _sites(cases, name, "eager-launches"), name
    # into host memory it is still a read of device data
    m = _metrics(cases, "is_cuda_host_write")
    assert (m["host-syncs"], m["bytes-moved"], m["eager-launches"]) == (1.0, 12.0, 0.0)


def test_is_cuda_ops_on_cpp_made_operands_are_launches(cases: dict[str, Any]) -> None:
    # einsum's bmm reads two operands it reshaped in C++: a device GEMM (two fp32 [1, 2, 3] / [1, 3, 2]: 2 x 24 B)
    m = _metrics(cases, "is_cuda_einsum")
    assert (m["eager-launches"], m["gemm-bytes"], m["host-syncs"]) == (1.0, 48.0, 0.0)
    assert _sites(cases, "is_cuda_einsum", "gemm-bytes") == [[cases["is_cuda_einsum"]["line"], 48]]


def test_is_cuda_cpu_read_gives_host_memory(cases: dict[str, Any]) -> None:
    # x.cpu() is the one read (24 B); reading and adding on its result is host work
    m = _metrics(cases, "is_cuda_cpu_read")
    assert (m["host-syncs"], m["bytes-moved"], m["eager-launches"]) == (1.0, 24.0, 0.0)
    assert _sites(cases, "is_cuda_cpu_read", "host-syncs") == [[cases["is_cuda_cpu_read"]["line"], 1]]


def test_collective_is_counted(cases: dict[str, Any]) -> None:
    assert _metrics(cases, "collective")["collectives"] == 1.0
    assert _sites(cases, "collective", "collectives") == [[cases["collective"]["line"], 1]]


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("capturable_item", "host sync (aten._local_scalar_dense)"),
        ("capturable_nonzero", "data-dependent shape (aten.nonzero)"),
        ("capturable_pageable", "pageable H2D copy (copy_)"),
    ],
)
def test_capturable_raises_naming_the_site(cases: dict[str, Any], name: str, what: str) -> None:
    assert cases[name]["error"] == f"{what} at {cases[name]['line']} inside a capturable region"
    assert _metrics(cases, name)["capturable"] is False


def test_capturable_passes_a_pure_elementwise_region(cases: dict[str, Any]) -> None:
    doc = cases["capturable_elementwise"]
    assert doc["error"] is None
    m = _metrics(cases, "capturable_elementwise")
    assert m["capturable"] is True
    assert m["graph-launches"] == 3.0 and m["eager-launches"] == 0.0


def test_cuda_graph_api_is_a_capture_region(cases: dict[str, Any]) -> None:
    m = _metrics(cases, "capture_graph_api")
    assert m["graph-launches"] == 1.0 and m["eager-launches"] == 0.0 and m["capturable"] is True
    assert _metrics(cases, "add")["capturable"] is None  # no region in the step


def test_a_graph_replay_reruns_the_captured_ops_as_graph_launches(cases: dict[str, Any]) -> None:
    doc = cases["graph_replay"]
    assert doc["value"] == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]  # (x + 1) * 2: the replay read the new x
    m = doc["report"]["metrics"]
    assert (m["graph-launches"], m["eager-launches"], m["host-syncs"]) == (2.0, 1.0, 0.0)
    assert [doc["line"], 1] in _sites(cases, "graph_replay", "graph-launches")  # the replay, at its line
    assert doc["report"]["kinds"]["graph-replays"] == 1


def test_a_replayed_upload_rereads_its_pinned_buffer(cases: dict[str, Any]) -> None:
    doc = cases["graph_replay_upload"]
    assert doc["value"] == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    m = doc["report"]["metrics"]
    # captured: the add (a launch) and the pinned upload (a copy, not a launch); the replay counts the add again and
    # copies nothing the census counts (on a GPU the graph's memcpy node is part of the launch)
    counted = (m["graph-launches"], m["h2d-copies"], m["pageable-copies"], m["capturable"])
    assert counted == (2.0, 1.0, 0.0, True)


def test_peak_memory_counts_live_allocations(cases: dict[str, Any]) -> None:
    assert _metrics(cases, "allocation")["peak-memory"] == 2048.0  # empty(256) f32 and y + 1 both alive


def test_alloc_bytes_sum_the_allocations_freed_or_not(cases: dict[str, Any]) -> None:
    assert _metrics(cases, "allocation")["alloc-bytes"] == 2048.0  # the two 1 KiB tensors
    freed = _metrics(cases, "allocations_freed")
    # three in turn, one alive at a time
    assert (freed["alloc-bytes"], freed["peak-memory"]) == (3072.0, 1024.0)
    assert _sites(cases, "allocations_freed", "alloc-bytes") == [[cases["allocations_freed"]["line"], 3072]]
    assert _metrics(cases, "view")["alloc-bytes"] == 0.0


def test_cpu_is_device_reads_cpu_as_the_engine_device(cases: dict[str, Any]) -> None:
    up = _metrics(cases, "cpu_is_device_upload")
    assert (up["h2d-copies"], up["pageable-copies"], up["host-syncs"]) == (1.0, 1.0, 0.0)
    assert _sites(cases, "cpu_is_device_upload", "h2d-copies") == [[cases["cpu_is_device_upload"]["line"], 1]]
    read = _metrics(cases, "cpu_is_device_read")
    assert (read["h2d-copies"], read["host-syncs"]) == (0.0, 1.0)


def test_resume_counts_into_an_earlier_step(cases: dict[str, Any]) -> None:
    per_step = cases["resume"]["report"]["per_step"]
    assert [s["eager-launches"] for s in per_step] == [1, 1]  # x * 2 in the first step, x + 1 in the second
    assert _sites(cases, "resume", "eager-launches")[0][0] != _sites(cases, "resume", "eager-launches")[1][0]


def test_a_kernel_stand_in_is_one_launch(cases: dict[str, Any]) -> None:
    m = _metrics(cases, "kernel")
    assert (m["eager-launches"], m["host-syncs"]) == (1.0, 0.0)
    assert _sites(cases, "kernel", "eager-launches") == [[cases["kernel"]["line"], 1]]


def test_blind_spots_behave_as_documented(cases: dict[str, Any]) -> None:
    # each of these is a limitation named in the census's module docstring; a change of behaviour updates both
    assert _metrics(cases, "blind_thread")["host-syncs"] == 0.0  # modes are per thread
    assert _metrics(cases, "blind_imported_by_name")["collectives"] == 0.0  # bound before the patch
    assert _metrics(cases, "blind_numpy_work")["host-syncs"] == 1.0
    assert _metrics(cases, "blind_numpy_work")["eager-launches"] == 0.0
    assert _metrics(cases, "blind_to_cpu_device")["host-syncs"] == 1.0  # over-counts: spell the device cpu:0
    assert (
        _metrics(cases, "blind_cpu_factory")["host-syncs"] == 1.0
    )  # over-counts: make host buffers in c.host()
    # under-counts an upload: spell it torch.tensor(data, device=)
    assert _metrics(cases, "blind_new_tensor")["h2d-copies"] == 0.0
