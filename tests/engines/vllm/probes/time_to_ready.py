"""Where vLLM's time to ready goes on the CPU build: run with a vLLM arm's interpreter (docs/engines/vllm.md).

    ARM/bin/python tests/engines/vllm/probes/time_to_ready.py MODE MODEL [OUT.jsonl]

MODE ``imports``: one fresh process importing, in order, torch, vllm, ``vllm.LLM`` and the V1 engine core; the time of
each step (and the interpreter's own start, from the launch time the caller passes in OVERLAY_TTR_LAUNCH).
MODE ``inproc``: the engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the uni executor), each start-up phase
timed by wrapping vLLM's own functions (nothing of vLLM is changed): engine config, engine core, worker device init,
model load, memory profiling, KV cache allocation, warm-up, then the first token.
MODE ``mp``: vLLM's default layout (engine core and worker in spawned processes). Spawn runs this file's top level
again in each child, which installs the same wrappers there and records when the child started and when its imports
were done; the caller's own phases and the first token are recorded by the parent.

Each event is one JSON line {"pid", "role", "what", "t0", "t1"} (wall-clock seconds) appended to the file that
OVERLAY_TTR_OUT names (default ttr.jsonl). Test infrastructure: vLLM's logs go to stderr.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Any

T_FIRST_LINE = time.time()
ROLE = "parent" if __name__ == "__main__" else "child"

WRAPPED = (
    ("vllm.engine.arg_utils", "EngineArgs", "create_engine_config", "engine config"),
    ("vllm.v1.engine.core_client", "MPClient", "__init__", "start engine core process and handshake"),
    ("vllm.v1.engine.core", "EngineCore", "__init__", "engine core init"),
    ("vllm.v1.engine.core", "EngineCore", "_initialize_kv_caches", "profile + KV cache + warm-up"),
    ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor", "_init_executor", "start worker process"),
    (
        "vllm.v1.worker.cpu_worker",
        "CPUWorker",
        "init_device",
        "worker init_device (distributed, model runner)",
    ),
    ("vllm.v1.worker.cpu_worker", "CPUWorker", "load_model", "load model"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker", "determine_available_memory", "memory profiling"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker", "initialize_from_config", "KV cache allocation"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker", "compile_or_warm_up_model", "compile or warm up"),
    ("vllm.entrypoints.llm", "LLM", "__init__", "LLM() total"),
)


def record(what: str, t0: float, t1: float) -> None:
    with open(os.environ.get("OVERLAY_TTR_OUT", "ttr.jsonl"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "role": ROLE, "what": what, "t0": t0, "t1": t1}) + "\n")


def _timed(fn: Any, what: str) -> Any:
    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            record(what, t0, time.time())

    return inner


def install() -> None:
    import importlib

    for module, cls, attr, what in WRAPPED:
        owner = getattr(importlib.import_module(module), cls)
        setattr(owner, attr, _timed(getattr(owner, attr), what))


if ROLE == "child" and os.environ.get("OVERLAY_TTR_MODE") == "mp":
    record("child: interpreter start to this file's first line", T_FIRST_LINE, T_FIRST_LINE)
    t = time.time()
    install()
    record("child: import vllm's engine modules", t, time.time())


def imports() -> None:
    import importlib

    launch = float(os.environ.get("OVERLAY_TTR_LAUNCH", T_FIRST_LINE))
    record("interpreter start (launch to first line)", launch, T_FIRST_LINE)
    for module in (
        "torch",
        "vllm",
        "vllm.entrypoints.llm",
        "vllm.v1.engine.core",
        "vllm.v1.worker.cpu_worker",
    ):
        t = time.time()
        importlib.import_module(module)
        record(f"import {module}", t, time.time())


def engine(model: str, *, in_process: bool) -> None:
    if in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    launch = float(os.environ.get("OVERLAY_TTR_LAUNCH", T_FIRST_LINE))
    record("interpreter start (launch to first line)", launch, T_FIRST_LINE)
    t = time.time()
    install()
    record("import vllm's engine modules", t, time.time())
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = {
        "model": model,
        "dtype": "float32",
        "max_model_len": 2048,
        "enforce_eager": True,
    }
    if in_process:
        kwargs["distributed_executor_backend"] = "uni"
    llm = LLM(**kwargs)
    t = time.time()
    llm.generate(
        [{"prompt_token_ids": [0, 5, 6, 7]}], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False
    )
    record("first token (a 4-token prompt)", t, time.time())
    record("launch to first token", launch, time.time())
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def main() -> None:
    mode, model = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    if len(sys.argv) > 3:
        os.environ["OVERLAY_TTR_OUT"] = sys.argv[3]
    os.environ["OVERLAY_TTR_MODE"] = mode
    os.dup2(2, 1)  # vLLM logs to stdout
    if mode == "imports":
        imports()
    elif mode in ("inproc", "mp"):
        engine(model, in_process=mode == "inproc")
    else:
        raise SystemExit(f"unknown mode {mode!r}: imports, inproc or mp")
    sys.stderr.flush()
    os._exit(0)  # the engine's shutdown is not part of time to ready


if __name__ == "__main__":
    main()
