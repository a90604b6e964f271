"""What each process of a vLLM cold start imports itself (test infrastructure for the ``cold-start`` census, see
vllm_cold.py; runs inside a vLLM arm, never imports overlay).

``install()`` runs first in every process of the engine: in the census process itself (called by vllm_cold.py), and
in every interpreter it starts, through a ``sitecustomize`` on PYTHONPATH (a spawned engine core or worker is a fresh
interpreter that imports everything again), which first runs the arm's own ``sitecustomize`` it shadows
(``run_shadowed``: what that imports is start-up, as in the census process). A forked child runs no interpreter
start: it inherits this module's state, and ``os.register_at_fork`` marks what it inherited, so it counts only what
it imports after the fork.

Per process it keeps:
- ``baseline``: the modules present at ``install()`` (an interpreter's own start-up modules, imported by itself) or,
  in a forked child, at the fork (inherited, not counted);
- ``log``: name -> wall time of the first lookup of every module not yet imported (a finder first on ``sys.meta_path``
  that records and declines), so a module's import time is known and the census can stop at the first token;
- ``starts``: every ``multiprocessing`` process start: its start method, and the native threads of the starting
  process at that moment (``/proc/self/task``: Python's, ZeroMQ's, and anything else, e.g. an OpenMP pool).

Every recording process announces itself (``OVERLAY_COLD_OUT/PID.alive``). ``dump()`` writes
``OVERLAY_COLD_OUT/PID.json`` once: when the census asks (SIGUSR1, which vLLM does not use; vllm_cold.py sends it to
every announced process after the first token, so no record depends on how the engine shuts down), else at the
process's exit (``atexit``; ``multiprocessing.util.Finalize`` in a multiprocessing child, which ends with ``os._exit``
after its finalizers). The record: the modules it imported itself (with their times), its threads with their allowed
CPUs, ``torch.get_num_threads()``, which OpenMP / allocator libraries are mapped, and its resident memory then and at
its peak so far (``/proc/self/status``).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from typing import Any

_STATE: dict[str, Any] = {}
_LIBS = ("libgomp", "libiomp5", "libomp.so", "libtcmalloc")


class _Recorder:
    """First on ``sys.meta_path``: records the first lookup of each module name and lets the real finders find it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        log: dict[str, float] = _STATE["log"]
        if name not in log:
            log[name] = time.time()

    def invalidate_caches(self) -> None:
        pass


def run_shadowed(own: str) -> None:
    """Run the ``sitecustomize`` module that the one at ``own`` shadows: the next ``sitecustomize.py`` on ``sys.path``
    after ``own``'s folder (the arm's test harness, e.g. support/testbackends/vllm/site), as the interpreter would have
    run it. Python imports only the first ``sitecustomize`` it finds."""
    import importlib.util

    folder = os.path.dirname(os.path.abspath(own))
    later = False
    for entry in sys.path:
        path = os.path.abspath(entry or os.curdir)
        if not later:
            later = path == folder
            continue
        candidate = os.path.join(path, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_overlay_shadowed_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            return


def threads() -> list[dict[str, Any]]:
    """This process's native threads: id, name, allowed CPUs, and whether Python knows it."""
    import threading

    python_ids = {t.native_id for t in threading.enumerate()}
    rows: list[dict[str, Any]] = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        base = f"/proc/self/task/{tid}"
        try:
            with open(f"{base}/comm", encoding="utf-8") as fh:
                comm = fh.read().strip()
            with open(f"{base}/status", encoding="utf-8") as fh:
                cpus = next(
                    (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("Cpus_allowed_list")), "?"
                )
        except OSError:
            continue  # the thread ended
        rows.append({"tid": int(tid), "comm": comm, "cpus": cpus, "python": int(tid) in python_ids})
    return rows


def _mapped_libs() -> list[str]:
    found: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            for line in fh:
                path = line.rsplit(" ", 1)[-1].strip()
                for lib in _LIBS:
                    if lib in os.path.basename(path):
                        found.add(os.path.basename(path))
    except OSError:
        pass
    return sorted(found)


def _announce() -> None:
    out = os.environ.get("OVERLAY_COLD_OUT")
    if out:
        with open(os.path.join(out, f"{os.getpid()}.alive"), "w", encoding="utf-8") as fh:
            fh.write(str(os.getppid()))


def _on_request(_signum: int, _frame: Any) -> None:
    dump()


def _after_fork_in_child() -> None:
    _STATE.update(
        forked=True,
        t_fork=time.time(),
        baseline=set(sys.modules),
        log={},
        starts=[],
        dumped=False,
        pid=os.getpid(),
    )
    _announce()


def _after_mp_child(_obj: object) -> None:
    """A multiprocessing child (forked or spawned) ends with os._exit after its finalizers: dump from one."""
    from multiprocessing import util

    util.Finalize(None, dump, exitpriority=100)


def _wrap_process_start() -> None:
    from multiprocessing import process, util

    original = process.BaseProcess.start
    if getattr(original, "_overlay_cold", False):
        return

    def start(self: Any) -> None:
        _STATE["starts"].append(
            {
                "t": time.time(),
                "name": self.name,
                "method": getattr(self, "_start_method", None),
                "threads": threads(),
            }
        )
        original(self)

    start._overlay_cold = True  # type: ignore[attr-defined]
    process.BaseProcess.start = start  # type: ignore[method-assign]
    util.register_after_fork(_Recorder, _after_mp_child)


def install() -> None:
    """Start recording in this process (idempotent)."""
    if _STATE.get("pid") == os.getpid():
        return
    _STATE.update(
        pid=os.getpid(),
        forked=False,
        t_install=time.time(),
        t_fork=None,
        baseline=set(sys.modules),
        log={},
        starts=[],
        dumped=False,
    )
    sys.meta_path.insert(0, _Recorder())
    os.register_at_fork(after_in_child=_after_fork_in_child)
    atexit.register(dump)
    signal.signal(signal.SIGUSR1, _on_request)
    _wrap_process_start()
    _announce()


def imported() -> list[tuple[str, float | None]]:
    """The modules this process imported itself: (name, time of its first lookup, or None when no lookup was seen,
    e.g. a module an import put into sys.modules under a second name). Start-up modules carry the install time."""
    log: dict[str, float] = _STATE["log"]
    rows: list[tuple[str, float | None]] = []
    baseline: set[str] = _STATE["baseline"]
    start = None if _STATE["forked"] else float(_STATE["t_install"])
    for name in list(sys.modules):
        if name == __name__ or name == "sitecustomize":
            continue  # the census's own modules
        if name in baseline:
            if start is not None:
                rows.append((name, start))
            continue
        rows.append((name, log.get(name)))
    return rows


def memory() -> dict[str, int]:
    """This process's resident memory now (``VmRSS``) and its peak so far (``VmHWM``), in bytes (Linux)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found["rss" if key == "VmRSS" else "hwm"] = int(value.split()[0]) * 1024  # kB
    except OSError:
        pass
    return found


def snapshot(**extra: Any) -> dict[str, Any]:
    from multiprocessing import current_process

    torch_threads = None
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        torch_threads = int(torch.get_num_threads())
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "name": current_process().name,
        "argv": sys.argv[:3],
        "forked": bool(_STATE["forked"]),
        "t_install": _STATE["t_install"],
        "t_fork": _STATE["t_fork"],
        "t_exit": time.time(),
        "inherited": len(_STATE["baseline"]) if _STATE["forked"] else 0,
        "modules": imported(),
        "starts": _STATE["starts"],
        "threads": threads(),
        "memory": memory(),
        "torch_threads": torch_threads,
        "omp_env": {
            k: os.environ[k]
            for k in (
                "OMP_NUM_THREADS",
                "GOMP_CPU_AFFINITY",
                "OMP_PLACES",
                "OMP_PROC_BIND",
                "KMP_AFFINITY",
                "LD_PRELOAD",
                "VLLM_WORKER_MULTIPROC_METHOD",
            )
            if k in os.environ
        },
        "libs": _mapped_libs(),
        **extra,
    }


def dump(**extra: Any) -> None:
    """Write this process's record to OVERLAY_COLD_OUT/PID.json (once per process)."""
    import json

    out = os.environ.get("OVERLAY_COLD_OUT")
    if not out or _STATE.get("dumped") or _STATE.get("pid") != os.getpid():
        return
    _STATE["dumped"] = True
    doc = snapshot(**extra)
    path = os.path.join(out, f"{os.getpid()}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(path + ".tmp", path)
