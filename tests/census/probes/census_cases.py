"""Probe: each construct the torch census counts, run alone in one census step (inside an arm venv with CPU torch).

stdin: {"cases": [name, ...]}; stdout: {name: {"report": census report, "line": the construct's line, "error": str}}.
Each case function marks the line of its construct with a "# here" comment; the test compares call sites with it.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src" / "overlay" / "engines" / "workers"))
from torch_census import CaptureViolation, Census


def c_item(c: Census, x: torch.Tensor) -> Any:
    x[0].item()  # here


def c_int(c: Census, x: torch.Tensor) -> Any:
    int(x[1])  # here


def c_bool(c: Census, x: torch.Tensor) -> Any:
    bool(x[1])  # here


def c_if(c: Census, x: torch.Tensor) -> Any:
    if x[1]:  # here
        pass


def c_tolist(c: Census, x: torch.Tensor) -> Any:
    x.tolist()  # here


def c_cpu(c: Census, x: torch.Tensor) -> Any:
    x.cpu()  # here


def c_to_cpu(c: Census, x: torch.Tensor) -> Any:
    x.to("cpu")  # here


def c_to_cpu_async(c: Census, x: torch.Tensor) -> Any:
    x.to("cpu", non_blocking=True)  # here


def c_numpy(c: Census, x: torch.Tensor) -> Any:
    x.numpy()  # here


def c_nonzero(c: Census, x: torch.Tensor) -> Any:
    torch.nonzero(x)  # here


def c_equal(c: Census, x: torch.Tensor) -> Any:
    torch.equal(x, x)  # here


def c_masked_select(c: Census, x: torch.Tensor) -> Any:
    m = x > 2
    torch.masked_select(x, m)  # here


def c_unique(c: Census, x: torch.Tensor) -> Any:
    torch.unique(x)  # here


def c_bool_mask_index(c: Census, x: torch.Tensor) -> Any:
    m = x > 2
    x[m]  # here


def c_bool_mask_put_tensor(c: Census, x: torch.Tensor) -> Any:
    m = x > 2
    v = torch.zeros(())
    x[m] = v  # here


def c_bool_mask_fill(c: Census, x: torch.Tensor) -> Any:
    m = x > 2
    x[m] = 0.0  # here


def c_int_index(c: Census, x: torch.Tensor) -> Any:
    idx = torch.arange(2)
    x[idx]  # here


def c_host_item(c: Census, x: torch.Tensor) -> Any:
    with c.host():
        h = torch.arange(3)
    h[0].item()  # here


def c_synchronize(c: Census, x: torch.Tensor) -> Any:
    torch.cuda.synchronize()  # here


def c_event_sync(c: Census, x: torch.Tensor) -> Any:
    ev = torch.cuda.Event()
    ev.record()
    ev.synchronize()  # here


def c_stream_sync(c: Census, x: torch.Tensor) -> Any:
    torch.cuda.current_stream().synchronize()  # here


def c_h2d_pageable(c: Census, x: torch.Tensor) -> Any:
    with c.host():
        h = torch.ones(6)
    x.copy_(h, non_blocking=True)  # here


def c_h2d_pinned(c: Census, x: torch.Tensor) -> Any:
    h = torch.ones(6, pin_memory=True)
    x.copy_(h, non_blocking=True)  # here


def c_h2d_pin_method(c: Census, x: torch.Tensor) -> Any:
    with c.host():
        h = torch.ones(6)
    p = h.pin_memory()
    x.copy_(p, non_blocking=True)  # here


def c_h2d_blocking(c: Census, x: torch.Tensor) -> Any:
    h = torch.ones(6, pin_memory=True)
    x.copy_(h)  # here


def c_tensor_device(c: Census, x: torch.Tensor) -> Any:
    torch.tensor([1, 2, 3], device="cpu:0")  # here


def c_tensor_host(c: Census, x: torch.Tensor) -> Any:
    torch.tensor([1, 2, 3])  # here


def c_view(c: Census, x: torch.Tensor) -> Any:
    x.view(2, 3)  # here


def c_views(c: Census, x: torch.Tensor) -> Any:
    x.view(2, 3).transpose(0, 1)[0]  # here


def c_add(c: Census, x: torch.Tensor) -> Any:
    x + 1  # here


def c_sort(c: Census, x: torch.Tensor) -> Any:
    x.sort(dim=-1)  # here


def c_argsort(c: Census, x: torch.Tensor) -> Any:
    x.view(2, 3).argsort(dim=-1, stable=True)  # here


def c_matmul(c: Census, x: torch.Tensor) -> Any:
    x.view(2, 3) @ x.view(3, 2)  # here


def c_linear_bf16(c: Census, x: torch.Tensor) -> Any:
    w = x.new_ones((4, 6), dtype=torch.bfloat16)
    h = x.view(1, 6).to(torch.bfloat16)
    torch.nn.functional.linear(h, w)  # here


def c_scaled_mm(c: Census, x: torch.Tensor) -> Any:
    a = x.new_zeros((16, 32)).to(torch.float8_e4m3fn)
    b = x.new_zeros((16, 32)).to(torch.float8_e4m3fn)
    s = x.new_ones(())
    torch._scaled_mm(a, b.t(), scale_a=s, scale_b=s, out_dtype=torch.bfloat16)  # here


def c_reshape_copy(c: Census, x: torch.Tensor) -> Any:
    x.view(2, 3).t().reshape(6)  # here: one copy kernel (clone), then _unsafe_view (an alias, no kernel)


def c_topk(c: Census, x: torch.Tensor) -> Any:
    x.topk(2)  # here


def c_collective(c: Census, x: torch.Tensor) -> Any:
    import torch.distributed as dist

    try:
        dist.all_reduce(x)  # here
    except (RuntimeError, ValueError):
        pass  # no process group: the call was still made and counted


def c_capturable_item(c: Census, x: torch.Tensor) -> Any:
    with c.capturable():
        x[0].item()  # here


def c_capturable_nonzero(c: Census, x: torch.Tensor) -> Any:
    with c.capturable():
        torch.nonzero(x)  # here


def c_capturable_pageable(c: Census, x: torch.Tensor) -> Any:
    with c.host():
        h = torch.ones(6)
    with c.capturable():
        x.copy_(h, non_blocking=True)  # here


def c_capturable_elementwise(c: Census, x: torch.Tensor) -> Any:
    with c.capturable():
        y = x * 2 + 1  # here
        x.add_(y)


def c_capture_graph_api(c: Census, x: torch.Tensor) -> Any:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.mul_(2)  # here


def c_graph_replay(c: Census, x: torch.Tensor) -> Any:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2
    x.add_(1)
    g.replay()  # here: the captured multiply runs again on the new x
    return y


def c_graph_replay_upload(c: Census, x: torch.Tensor) -> Any:
    with c.host():
        h = torch.zeros(6).pin_memory()
    d = torch.zeros(6)
    g = torch.cuda.CUDAGraph()
    g.capture_begin()
    d.copy_(h, non_blocking=True)
    y = d + x
    g.capture_end()
    h.fill_(5.0)
    g.replay()  # here: the captured upload re-reads the pinned buffer
    return y


def c_allocation(c: Census, x: torch.Tensor) -> Any:
    y = torch.empty(256, dtype=torch.float32)  # here
    z = y + 1
    del y, z


def c_allocations_freed(c: Census, x: torch.Tensor) -> Any:
    for _ in range(3):
        y = torch.empty(256, dtype=torch.float32)  # here
        del y
    x.add_(1)  # in place: no allocation


def c_random_in_place(c: Census, x: torch.Tensor) -> Any:
    y = torch.empty_like(x)
    y.exponential_()  # here


def c_random_factory(c: Census, x: torch.Tensor) -> Any:
    torch.rand_like(x)  # here


def c_random_generator(c: Census, x: torch.Tensor) -> Any:
    g = torch.Generator().manual_seed(0)
    torch.empty_like(x)[:4].uniform_(generator=g)  # here


def c_multinomial(c: Census, x: torch.Tensor) -> Any:
    torch.multinomial(torch.ones(2, 3), 1)  # here: one aten op to the dispatch mode


def c_multinomial_expanded(c: Census, x: torch.Tensor) -> Any:
    # Census(expand=("multinomial",)) counts the aten ops of multinomial's kernel
    torch.multinomial(torch.ones(2, 3), 1)  # here


def c_cpu_is_device_upload(c: Census, x: torch.Tensor) -> Any:
    with c.host():
        h = torch.ones(6)
    h.to("cpu", non_blocking=True)  # here: on the GPU this line reads .to(self.device)


def c_cpu_is_device_read(c: Census, x: torch.Tensor) -> Any:
    x.to("cpu")  # here


def c_resume(c: Census, x: torch.Tensor) -> Any:
    step = c.steps[-1]
    with c.step():
        x + 1
    with c.resume(step):
        x * 2  # here: counted in the first step again


def c_kernel(c: Census, x: torch.Tensor) -> Any:
    with c.kernel("standin.op"):  # here: one launch; the stand-in's own ops and reads are not counted
        x[0].item()
        x + 1


# placement="is_cuda" (the ExLlamaV3 census): x is a _devsim.CensusDev, device memory is what answers is_cuda. Tensors
# made in C++ inside one Python call (the view __setitem__ writes through, einsum's operands of its bmm) are plain
# Tensors there; the census keeps their placement from the op that made them.


def c_is_cuda_setitem_slice(c: Census, x: torch.Tensor) -> Any:
    out = torch.empty_like(x)
    y = x[1::2] * 2
    out[0::2] = y  # here: a device-to-device copy kernel into a view of device memory


def c_is_cuda_setitem_made(c: Census, x: torch.Tensor) -> Any:
    y = x[1::2] * 2
    for out in (torch.zeros_like(x), x.new_empty(6), x.new_zeros(6), x.clone(), torch.cat([x[:3], x[3:]])):
        out[0::2] = y  # here: each destination answers is_cuda, so each write is one copy kernel


def c_is_cuda_einsum(c: Census, x: torch.Tensor) -> Any:
    torch.einsum("bij,bjk->bik", x.view(1, 2, 3), x.view(1, 3, 2))  # here: one bmm of two C++-made operands


def c_is_cuda_host_write(c: Census, x: torch.Tensor) -> Any:
    with c.host():
        h = torch.zeros(6)
    h[0::2] = x[1::2]  # here: a slice write from device data into host memory is still a host read


def c_is_cuda_cpu_read(c: Census, x: torch.Tensor) -> Any:
    h = x.cpu()  # here: one host read (the subclass's .cpu() returns x itself); h is host memory
    h[0].item()
    h + 1


# Blind spots (the module docstring lists them): each case shows the documented behaviour.


def c_blind_thread(c: Census, x: torch.Tensor) -> Any:
    import threading

    t = threading.Thread(target=lambda: x[0].item())  # here
    t.start()
    t.join()


from torch.distributed import all_reduce as _all_reduce_by_name


def c_blind_imported_by_name(c: Census, x: torch.Tensor) -> Any:
    try:
        _all_reduce_by_name(x)  # here
    except (RuntimeError, ValueError):
        pass


def c_blind_numpy_work(c: Census, x: torch.Tensor) -> Any:
    h = x.numpy()  # here: the one read is counted; the numpy work after it is invisible
    (h * 2).sum()


def c_blind_to_cpu_device(c: Census, x: torch.Tensor) -> Any:
    x.to(x.device)  # here: a CPU tensor's device has no index, so this reads as a D2H host read


def c_blind_cpu_factory(c: Census, x: torch.Tensor) -> Any:
    h = torch.zeros(3, device="cpu")  # here: a factory outside a host scope makes device memory
    h[0].item()


def c_blind_new_tensor(c: Census, x: torch.Tensor) -> Any:
    x.new_tensor([1.0, 2.0])  # here: Python data onto x's device (an H2D copy on CUDA) is not seen


CASES = {name[2:]: fn for name, fn in globals().items() if name.startswith("c_")}
# the Census options a case runs with (default: none)
OPTIONS: dict[str, dict[str, Any]] = {
    "cpu_is_device_upload": {"cpu_is_device": True},
    "cpu_is_device_read": {"cpu_is_device": True},
    "multinomial_expanded": {"expand": ("multinomial",)},
}
IS_CUDA = {name for name in CASES if name.startswith("is_cuda_")}


def _device_class() -> type:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engines" / "exllamav3" / "probes"))
    import _devsim

    cls: type = _devsim.CensusDev
    return cls


def run(name: str) -> dict[str, Any]:
    fn = CASES[name]
    lines, start = inspect.getsourcelines(fn)
    here = next(start + i for i, text in enumerate(lines) if "# here" in text)
    x = torch.arange(6.0)
    options = dict(OPTIONS.get(name, {}))
    if name in IS_CUDA:
        cls = _device_class()
        options.update(placement="is_cuda", device_class=cls, skip=(sys.modules[cls.__module__].__file__,))
        x = x.as_subclass(options["device_class"])
    error, value = None, None
    with Census(**options) as c, c.step():
        try:
            value = fn(c, x)
        except CaptureViolation as err:
            error = str(err)
    return {
        "report": c.report(),
        "line": f"{os.path.relpath(__file__)}:{here}",
        "error": error,
        "value": value.tolist() if isinstance(value, torch.Tensor) else None,
    }


if __name__ == "__main__":
    names = json.loads(sys.stdin.read() or "{}").get("cases") or list(CASES)
    sys.stdout.write(json.dumps({name: run(name) for name in names}))
