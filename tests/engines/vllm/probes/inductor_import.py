"""Who imports torch's Inductor in vLLM's real path: run with a vLLM arm's interpreter (docs/engines/vllm.md).

    ARM/bin/python tests/engines/vllm/probes/inductor_import.py MODE [MODEL]

Installs a meta-path finder that records the first import of ``torch._inductor``, ``torch._inductor.lowering``,
``torch._inductor.graph`` and ``torch._dynamo`` with the importing stack. With OVERLAY_DEFER_INDUCTOR=1 it also refuses
those imports when they come from ``vllm.env_override._patch_inductor_fallback_allow_list`` (which catches ImportError
and returns), which is what deferring that patch to Inductor's first import would do; every other importer goes
through, so what is recorded then is who imports Inductor anyway.

MODE ``import``: ``import vllm``. ``uni``: ``LLM(...)`` in this process (uni executor) and one 1-token generate, as the
check's measuring tasks run it (eager, float32). ``mp``: the same with vLLM's default layout (engine core and worker
in spawned processes; spawn runs this file's top level again in each, which installs the finder there too).

Each process writes ``PID.txt`` under OVERLAY_INDUCTOR_OUT (default ``inductor-import``): its argv, one block per
first import (or refusal), and at exit whether ``torch._inductor.lowering`` was loaded. Test infrastructure.
"""

from __future__ import annotations

import atexit
import os
import sys
import traceback
from importlib.machinery import ModuleSpec
from typing import Any

WATCH = ("torch._inductor", "torch._inductor.lowering", "torch._inductor.graph", "torch._dynamo")
DEFERRED_BY = "_patch_inductor_fallback_allow_list"
OUT = os.environ.get("OVERLAY_INDUCTOR_OUT", "inductor-import")
DEFER = os.environ.get("OVERLAY_DEFER_INDUCTOR") == "1"
LOG: list[str] = []


class Recorder:
    def find_spec(self, name: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if name not in WATCH:
            return None
        stack = traceback.extract_stack()[:-1]
        if DEFER and any(f.name == DEFERRED_BY for f in stack):
            LOG.append(f"REFUSED {name} (from {DEFERRED_BY})")
            raise ImportError(f"{name}: deferred by the probe")
        frames = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in stack]
        kept = [f for f in frames if "importlib" not in f and "inductor_import.py" not in f]
        LOG.append(
            f"FIRST {name}\n  " + "\n  ".join(kept[-int(os.environ.get("OVERLAY_INDUCTOR_FRAMES", "12")) :])
        )
        return None


def dump() -> None:
    os.makedirs(OUT, exist_ok=True)
    loaded = sum(1 for m in sys.modules if m.startswith("torch._inductor"))
    with open(os.path.join(OUT, f"{os.getpid()}.txt"), "w") as fh:
        fh.write(" ".join(sys.argv) + "\n" + "\n".join(LOG) + "\n")
        fh.write(f"AT EXIT: lowering={'torch._inductor.lowering' in sys.modules} inductor_modules={loaded}\n")


sys.meta_path.insert(0, Recorder())
atexit.register(dump)


def main() -> None:
    mode = sys.argv[1]
    if mode == "import":
        import vllm  # noqa: F401

        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if mode == "uni":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = {
        "model": sys.argv[2],
        "dtype": "float32",
        "max_model_len": 2048,
        "enforce_eager": True,
        "seed": 0,
    }
    if mode == "uni":
        kwargs["distributed_executor_backend"] = "uni"
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], params, use_tqdm=False)
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


if __name__ == "__main__":
    main()
