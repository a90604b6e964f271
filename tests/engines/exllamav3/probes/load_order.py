"""Probe: the order and overlap of the draft and target loads in model_init.init().

Model.load is replaced by a recorder that sleeps (a load needs the CUDA extension); it records which model loaded,
on which thread, when, and with which arguments. Warmup is a no-op.

payload: {"argv": [...]} or {"cases": [...]}
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import run_cases, tiny_dflash2, tiny_llama


def case(payload: dict[str, Any]) -> dict[str, Any]:
    import argparse

    from exllamav3 import Model, model_init

    events: list[dict[str, Any]] = []

    def recording_load(self: Any, *args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        time.sleep(0.3)
        events.append(
            {
                "model": type(self).__name__,
                "thread": "main" if threading.current_thread() is threading.main_thread() else "worker",
                "t0": t0,
                "t1": time.perf_counter(),
                "kwargs": {
                    k: v
                    for k, v in sorted(kwargs.items())
                    if isinstance(v, (bool, int, float, str, list)) or v is None
                },
            }
        )

    Model.load = recording_load
    Model.warmup = lambda self, *a, **k: []
    with tempfile.TemporaryDirectory() as tmp:
        target = tiny_llama(Path(tmp) / "t")
        draft = tiny_dflash2(Path(tmp) / "d", layer_types=["sliding_attention"] * 3)
        parser = argparse.ArgumentParser(exit_on_error=False)
        model_init.add_args(parser, add_draft_model_args=True)
        try:
            args = parser.parse_args(["-m", str(target), "-dm", str(draft), "-cs", "1024", *payload["argv"]])
        except (argparse.ArgumentError, SystemExit) as e:
            return {"error": f"argparse: {e}"}
        try:
            model_init.init(args, load_tokenizer=False, quiet=True, progress=False)
        except ValueError as e:
            return {"error": str(e)}
    events.sort(key=lambda e: e["t0"])
    overlap = len(events) == 2 and events[1]["t0"] < events[0]["t1"]
    return {
        "order": [e["model"] for e in events],
        "threads": [e["thread"] for e in events],
        "overlap": overlap,
        "kwargs": {e["model"]: e["kwargs"] for e in events},
    }


if __name__ == "__main__":
    run_cases(case)
