"""The ``cold-start`` census scenario of vLLM's CPU build: what a cold start imports, process by process (runs inside a
vLLM arm; never imports overlay). vllm_census.py dispatches scenario "cold-start" here: ``census(req)``.

The engine starts as ``LLM()`` and ``vllm serve`` start it (V1 multiprocessing: the engine core in a child process,
the CPU worker in a grandchild, the multiproc executor), with the census's settings (float32, eager, seed 0), and
generates one token: launch to that token is the cold start. Then it generates GREEDY_TOKENS more per prompt of
GREEDY_PROMPTS (outside the counted window) so a test can compare outputs, and shuts down.

Metric ``module-imports``: modules imported from scratch across the engine's processes from launch to the first
token: the sum over processes of the modules each imported itself. Metric ``peak-memory``: the sum over the same
processes of their peak resident memory (``VmHWM``) at the first token: on the CPU build host memory is the device's,
and the KV cache, the weights and the imported code all live there. A spawned process is a fresh interpreter and
imports everything again; a forked one starts with its parent's modules, which are not counted for it. Counted with
vllm_cold_hook.py in each process (installed here, and through a ``sitecustomize`` on PYTHONPATH in every interpreter
the engine starts); a module counts when its first lookup was at or before the first token (one whose lookup was not
seen, e.g. put into ``sys.modules`` under a second name, counts too: ``untimed`` in the detail). multiprocessing's
resource tracker (a helper that outlives the engine) is not an engine process and is not counted. Every census is a
first launch: vLLM's cache (``VLLM_CACHE_ROOT``) is an empty folder of its own, so no run inherits what an earlier one
cached (the model-info cache: on a miss the parent imports the model's module to inspect it).

Reported too, not judged: time to first token (``detail.time_to_first_token_s``, launch from the kernel's process start
time), how each process started (launch, spawn, fork), the native threads of the starting process at each start, and
per process its threads' allowed CPUs, ``torch.get_num_threads()`` and the OpenMP / allocator libraries mapped (the
worker's OpenMP binding), and how many of its counted modules are in each of a few packages (``PACKAGES``). The other
census metrics are not counted here (None).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from overlay.schemas.documents import CensusRequest

METRIC = "module-imports"
MEMORY = "peak-memory"  # host memory is the CPU build's device memory: the processes' peak resident bytes
SCENARIO = "cold-start"
PROMPT = [0, 5, 6, 7]
GREEDY_PROMPTS = [[0, 11, 12, 13, 14, 15], [0, 200, 201, 17]]
GREEDY_TOKENS = 12
MAX_MODEL_LEN = 2048
RECORD_WAIT_S = 60.0
HELPER = "resource tracker"
# packages whose modules each process's record counts by name (detail.processes[].packages): what the series' loading
# patches keep out of the processes that do not use them (the OpenAI server's protocol types, Inductor's code
# generators) and what stays (torch._dynamo, which transformers imports)
PACKAGES = (
    "openai",
    "vllm.entrypoints",
    "vllm.parser",
    "torch._dynamo",
    "torch._inductor",
    "torch._inductor.lowering",
    "sympy",
    "networkx",
    "transformers.models.auto.auto_factory",
    "transformers.processing_utils",
    "torch.distributed.tensor",
)


def package_counts(names: list[str]) -> dict[str, int]:
    """How many of ``names`` are in each of PACKAGES (a package counts itself and its submodules)."""
    return {pkg: sum(1 for n in names if n == pkg or n.startswith(pkg + ".")) for pkg in PACKAGES}


def launch_time() -> float:
    """Wall time this process was started (the kernel's start time, 10 ms resolution)."""
    with open("/proc/self/stat", encoding="utf-8") as fh:
        start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime", encoding="utf-8") as fh:
        uptime = float(fh.read().split()[0])
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def _role(doc: dict[str, Any], parent: int) -> str:
    name = str(doc.get("name") or "")
    if doc["pid"] == parent:
        return "parent"
    if name == "EngineCore" or name.startswith("EngineCore_"):
        return "engine core" if name == "EngineCore" else f"engine core {name[11:]}"
    if name.startswith("VllmWorker"):
        return "worker" if name == "VllmWorker-0" else f"worker {name[11:]}"
    if any(m[0] == "multiprocessing.resource_tracker" for m in doc["modules"]) and name == "MainProcess":
        return HELPER
    if name == "MainProcess":
        return f"subprocess {' '.join(doc.get('argv') or [])}".strip()
    return name or f"pid {doc['pid']}"


def _unexplained(threads: list[dict[str, Any]]) -> list[str]:
    """Native threads that are neither Python's nor ZeroMQ's (e.g. an OpenMP or other native pool)."""
    return [t["comm"] for t in threads if not t["python"] and not str(t["comm"]).startswith("ZMQbg")]


def summarize(docs: list[dict[str, Any]], *, parent: int, t_first: float) -> dict[str, Any]:
    """Per-process counts and the metric from the hooks' records (pure: the tests call it on synthetic records)."""
    procs: list[dict[str, Any]] = []
    starts: list[dict[str, Any]] = []
    for doc in sorted(docs, key=lambda d: (d["pid"] != parent, d["t_install"] or 0.0)):
        role = _role(doc, parent)
        mods = doc["modules"]
        counted = [m for m in mods if m[1] is None or m[1] <= t_first]
        cpus = sorted({t["cpus"] for t in doc["threads"]})
        procs.append(
            {
                "role": role,
                "pid": doc["pid"],
                "name": doc.get("name"),
                "started": "launch" if doc["pid"] == parent else ("fork" if doc["forked"] else "spawn"),
                "counted": role != HELPER,
                "modules": len(counted),
                "packages": package_counts([m[0] for m in counted]),
                "untimed": sum(1 for m in counted if m[1] is None),
                "modules_recorded": len(mods),
                "inherited": doc["inherited"],
                "threads": len(doc["threads"]),
                "python_threads": sum(1 for t in doc["threads"] if t["python"]),
                "thread_names": dict(collections.Counter(str(t["comm"]) for t in doc["threads"])),
                "thread_cpus": cpus,
                "peak_rss_bytes": doc.get("memory", {}).get("hwm"),
                "torch_threads": doc.get("torch_threads"),
                "omp_env": doc.get("omp_env", {}),
                "libs": doc.get("libs", []),
            }
        )
        for s in doc.get("starts", []):
            starts.append(
                {
                    "by": role,
                    "child": s["name"],
                    "method": s["method"],
                    "threads": len(s["threads"]),
                    "unexplained_threads": _unexplained(s["threads"]),
                }
            )
    total = sum(p["modules"] for p in procs if p["counted"])
    peaks = [p["peak_rss_bytes"] for p in procs if p["counted"]]
    peak = sum(peaks) if peaks and all(isinstance(b, int) for b in peaks) else None
    return {"total": total, "peak_memory": peak, "processes": procs, "starts": starts}


def _gib(nbytes: int | None) -> str:
    return "?" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def _engine(model: str) -> Any:
    import vllm_settings  # next to this module: the model's own settings (the hybrid qwen3_5: bfloat16, text only)
    from vllm import LLM

    args = {"dtype": "float32", **vllm_settings.model_settings(model)["engine_args"]}
    return LLM(model=model, max_model_len=MAX_MODEL_LEN, enforce_eager=True, seed=0, **args)


def _shutdown(llm: Any) -> None:
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def _request_records(out: Path, deadline: float) -> None:
    """Ask every other recording process still alive for its record now (SIGUSR1) and wait for them (up to
    ``deadline``): the records then cover launch to the first token whatever the engine's shutdown does."""
    import signal

    waiting: list[int] = []
    for mark in sorted(out.glob("*.alive")):
        pid = int(mark.stem)
        if pid == os.getpid() or (out / f"{pid}.json").exists():
            continue
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            continue  # it ended (its exit wrote its record, if it could)
        waiting.append(pid)
    while waiting and time.time() < deadline:
        time.sleep(0.2)
        waiting = [p for p in waiting if not (out / f"{p}.json").exists() and _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def census(req: CensusRequest) -> dict[str, Any]:
    """One cold start of the engine in vLLM's default layout, counted (see the module's docstring)."""
    if req.get("options"):
        raise SystemExit(f"vllm cold-start census: CLI options {sorted(req['options'])} are not applied")
    if req["scenario"] != SCENARIO:
        raise SystemExit(f"vllm cold-start census: scenario {req['scenario']!r} is not {SCENARIO!r}")
    t_launch = launch_time()
    workers = str(Path(__file__).resolve().parent)
    if workers not in sys.path:
        sys.path.insert(0, workers)
    import vllm_cold_hook

    with tempfile.TemporaryDirectory(prefix="overlay-cold-") as tmp:
        site = Path(tmp) / "site"
        out = Path(tmp) / "out"
        site.mkdir()
        out.mkdir()
        # the arm's own sitecustomize (the vLLM harness's: the torchvision stub where the model needs it) is shadowed
        # by this one: it runs first, so what it imports is the interpreter's start-up, as in this process
        (site / "sitecustomize.py").write_text(
            "import vllm_cold_hook\n\nvllm_cold_hook.run_shadowed(__file__)\nvllm_cold_hook.install()\n"
        )
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), workers, os.environ.get("PYTHONPATH", "")) if p
        )
        os.environ["OVERLAY_COLD_OUT"] = str(out)
        # every census a first launch: vLLM caches what it learns of a model class (VLLM_CACHE_ROOT/modelinfos) and
        # on a miss imports the model's module in the parent to inspect it (73 more modules there, measured), so with
        # the user's cache the first run on a machine would count more than the next (stock runs first)
        os.environ["VLLM_CACHE_ROOT"] = str(Path(tmp) / "vllm-cache")
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the default layout
        vllm_cold_hook.install()

        from vllm import SamplingParams

        llm = _engine(req["model"])
        t_ready = time.time()
        try:
            first = llm.generate(
                [{"prompt_token_ids": PROMPT}], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False
            )
            t_first = time.time()
            _request_records(out, deadline=time.time() + RECORD_WAIT_S)
            vllm_cold_hook.dump()
            res = llm.generate(
                [{"prompt_token_ids": p} for p in GREEDY_PROMPTS],
                SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS, ignore_eos=True),
                use_tqdm=False,
            )
        finally:
            _shutdown(llm)
        docs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]

    import vllm_settings
    from torch_census_steps import METRICS as TORCH_METRICS

    summary = summarize(docs, parent=os.getpid(), t_first=t_first)
    roles = [p["role"] for p in summary["processes"]]
    ttft = t_first - t_launch
    metrics: dict[str, Any] = dict.fromkeys(TORCH_METRICS)
    metrics[METRIC] = summary["total"]
    metrics[MEMORY] = summary["peak_memory"]
    counted = [p for p in summary["processes"] if p["counted"]]
    layout = ", ".join(f"{p['role']} {p['started']}" for p in counted)
    per_process = ", ".join(f"{p['role']} {p['modules']}" for p in counted)
    notes = [
        (
            f"cold start, default layout ({layout}): launch to first token {ttft:.1f} s, "
            f"{summary['total']} modules imported from scratch ({per_process}); peak resident memory "
            + ", ".join(f"{p['role']} {_gib(p['peak_rss_bytes'])}" for p in counted)
        ),
        "one cold start per arm (steps: 1); time to first token is reported, not judged",
        f"not counted in {SCENARIO}: {', '.join(m for m in TORCH_METRICS if m != MEMORY)}",
    ]
    if "engine core" not in roles or "worker" not in roles:
        notes.append(
            f"records missing: only {', '.join(roles)} wrote one (a process killed before its exit?)"
        )
    return {
        "scenario": SCENARIO,
        "steps": 1,
        "metrics": metrics,
        "sites": {
            METRIC: sorted(([p["role"], p["modules"]] for p in counted), key=lambda r: -int(r[1])),
            MEMORY: sorted(
                ([p["role"], p["peak_rss_bytes"] or 0] for p in counted), key=lambda r: -int(r[1])
            ),
        },
        "detail": {
            "kinds": {p["role"]: p["modules"] for p in counted},
            "per_step": [{METRIC: summary["total"]}],
            "uncounted": {},
            "time_to_first_token_s": ttft,
            "launch_to_ready_s": t_ready - t_launch,
            "processes": summary["processes"],
            "starts": summary["starts"],
            "first_token": [int(t) for t in first[0].outputs[0].token_ids],
            "greedy": [[int(t) for t in r.outputs[0].token_ids] for r in res],
        },
        "notes": notes,
        "standin": vllm_settings.standin_label(),
    }
