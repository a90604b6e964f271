"""TEST INFRASTRUCTURE (overlay SGLang CPU harness): run ``sglang.Engine`` offline and print JSON.

Run with the arm's interpreter (stock or patched SGLang on ``sys.path``, ``site/`` of this package on
``PYTHONPATH``, ``SGLANG_USE_CPU_ENGINE=1``). Reads one JSON payload on stdin, prints one JSON document on stdout
(logs go to stderr)::

    {"model": "/path/to/hf-model",                      # target model folder (HF format)
     "prompts": [[1, 5, 9], ...],                        # token ids (the engine runs with skip_tokenizer_init)
     "max_new_tokens": 16,
     "dtype": "float32",                                 # optional, default float32
     "runs": [                                           # one Engine per run, started and shut down in turn
        {"name": "plain"},
        {"name": "standalone", "spec": {"algorithm": "STANDALONE", "draft_model": "/path",
                                        "num_steps": 1, "topk": 1, "num_draft_tokens": 2},
         "env": {"SGLANG_OVL_SOMETHING": "1"},           # optional, set before the engine starts
         "sampling": {"temperature": 0.0},               # optional: extra sampling params (or a list, per prompt)
         "server_info": true}]}                          # optional: add Engine.get_server_info() internal_states

Output::

    {"version": 1, "sglang": "0.5.23", "runs": {"plain": {"outputs": [{"output_ids": [...],
     "meta_info": {"spec_accept_length": ..., ...}}], "seconds": 41.2}, ...}}

Greedy decoding is the default (``temperature`` 0). Several runs share one process so the import cost is paid
once. Speculative runs use the ``intel_amx`` attention backend with the platform forced to report AMX (the
stand-in ``sgl_kernel`` provides the attention ops); ``torch_native`` is refused for EAGLE-family algorithms. A
run that selects ``intel_amx`` itself (``"engine_args": {"attention_backend": "intel_amx"}``: plain runs of MLA models,
which ``torch_native`` cannot serve) gets the same platform fact. Never shipped inside a patched wheel.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

_META_KEYS = (
    "spec_accept_length",
    "spec_accept_rate",
    "spec_verify_ct",
    "spec_accept_token_num",
    "spec_draft_token_num",
    "spec_correct_drafts_histogram",
    "spec_accept_histogram",
    "completion_tokens",
    "prompt_tokens",
    "finish_reason",
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


def _engine_kwargs(payload: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model_path": payload["model"],
        "device": "cpu",
        "dtype": payload.get("dtype", "float32"),
        "skip_tokenizer_init": True,
        "disable_cuda_graph": True,
        "sampling_backend": "pytorch",
        "attention_backend": "torch_native",
        "mem_fraction_static": 0.05,
        "max_total_tokens": 4096,
        "chunked_prefill_size": 1024,
        "max_running_requests": 8,
        "log_level": "error",
        "random_seed": int(payload.get("seed", 0)),
    }
    spec = run.get("spec")
    if spec:
        kwargs.update(
            {
                "speculative_algorithm": spec["algorithm"],
                "speculative_draft_model_path": spec.get("draft_model", payload["model"]),
                "speculative_num_steps": int(spec.get("num_steps", 1)),
                "speculative_eagle_topk": int(spec.get("topk", 1)),
                "speculative_num_draft_tokens": int(spec.get("num_draft_tokens", 2)),
                "attention_backend": "intel_amx",
            }
        )
    kwargs.update(run.get("engine_args", {}))
    return kwargs


def _force_amx_platform() -> None:
    """Keep ``intel_amx`` selected on a CPU without AMX (the stand-in sgl_kernel serves its ops)."""
    from sglang.srt.runtime_context import get_platform

    get_platform()._install(has_amx=True)


def _run_one(payload: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    import sglang

    saved = {k: os.environ.get(k) for k in run.get("env", {})}
    os.environ.update({k: str(v) for k, v in run.get("env", {}).items()})
    kwargs = _engine_kwargs(payload, run)
    if kwargs["attention_backend"] == "intel_amx":
        _force_amx_platform()
    started = time.monotonic()
    engine = sglang.Engine(**kwargs)
    try:
        base = {
            "temperature": 0.0,
            "max_new_tokens": int(payload.get("max_new_tokens", 16)),
            "ignore_eos": True,
        }
        extra = run.get("sampling", {})
        if isinstance(extra, list):
            sampling: Any = [{**base, **item} for item in extra]
        else:
            sampling = {**base, **extra}
        results = engine.generate(input_ids=payload["prompts"], sampling_params=sampling)
        server_info = None
        if run.get("server_info"):
            info = engine.get_server_info()
            server_info = _jsonable(info.get("internal_states", []))
    finally:
        engine.shutdown()
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
    outputs = []
    for result in results:
        meta = result.get("meta_info", {})
        outputs.append(
            {
                "output_ids": [int(t) for t in result["output_ids"]],
                "meta_info": {k: _jsonable(meta[k]) for k in _META_KEYS if k in meta},
            }
        )
    out: dict[str, Any] = {"outputs": outputs, "seconds": round(time.monotonic() - started, 2)}
    if server_info is not None:
        out["internal_states"] = server_info
    return out


def main() -> int:
    payload = json.load(sys.stdin)
    import sglang

    out: dict[str, Any] = {"version": 1, "sglang": getattr(sglang, "__version__", "?"), "runs": {}}
    for run in payload["runs"]:
        out["runs"][run["name"]] = _run_one(payload, run)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
