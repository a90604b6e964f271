"""0004: the CPU platform's Triton kernel overrides register in a process where numba is imported, stock vs patched
(long: the real engine, in-process layout, in each arm; about a minute each on the 2-core machine).

Stock's scan over ``sys.modules`` (``vllm/triton_utils/dispatcher.py`` ``_rebind_kernels``) reads every module
attribute's ``__dict__`` through ``hasattr``/``vars``, which fall back to the object's ``__getattr__``; llvmlite's
``binding.ffi.lib`` answers ``__dict__`` with a function wrapper, so the scan fails with "'_lib_fn_wrapper' object has
no attribute 'get'" in ``init_worker``: a script that imports numba (or anything that loads llvmlite) before it starts
an engine, and a second engine after an n-gram one in the same process (the n-gram proposer imports numba), cannot
start. Each test asserts that failure in the stock arm (its premise) and the fix in the patched arm.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arm, Arms

pytestmark = pytest.mark.long
FAILURE = "'_lib_fn_wrapper' object has no attribute 'get'"

SCAN = """
import json, sys, types
from vllm.triton_utils.dispatcher import _rebind_kernels

class Answering:  # as llvmlite's ffi.lib: no __dict__, and a __getattr__ that answers every name
    __slots__ = ()
    def __getattr__(self, name):
        return lambda *a: name

def original(): pass
class Owner: pass
owner = Owner(); owner.kernel = original
module = types.ModuleType("overlay_probe_module")
module.lib, module.owner, module.copy = Answering(), owner, original
sys.modules[module.__name__] = module
wrapper = object()
try:
    _rebind_kernels([(original, wrapper)])
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
else:
    print(json.dumps({"error": None, "owner": owner.kernel is wrapper, "copy": module.copy is wrapper}))
"""

NUMBA_FIRST = """
import json, os, sys
import numba  # noqa: F401  (a user's script that imports numba before it starts an engine)
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=512, enforce_eager=True, seed=0,
          distributed_executor_backend="uni")
out = llm.generate([{"prompt_token_ids": [0, 5, 6, 7]}], SamplingParams(temperature=0.0, max_tokens=8,
                   ignore_eos=True), use_tqdm=False)
print(json.dumps({"tokens": list(out[0].outputs[0].token_ids)}))
"""

PLAIN = NUMBA_FIRST.replace("import numba  # noqa: F401", "pass  #")

AFTER_NGRAM = """
import gc, json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
kw = dict(model=sys.argv[1], dtype="float32", max_model_len=512, enforce_eager=True, seed=0,
          distributed_executor_backend="uni")
params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
prompt = [{"prompt_token_ids": [0, 5, 6, 7, 5, 6, 7, 5, 6]}]
ngram = LLM(**kw, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                      "prompt_lookup_min": 2, "prompt_lookup_max": 5})
first = list(ngram.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids)
ngram.llm_engine.engine_core.shutdown()
del ngram
gc.collect()
second = LLM(**kw)  # a second engine in the same process, after the n-gram proposer imported numba
print(json.dumps({"ngram": first, "second": list(second.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids),
                  "numba": "numba" in sys.modules}))
"""


def run(arm: Arm, code: str, *args: str) -> tuple[dict[str, Any] | None, str]:
    proc = arm.run(["-c", code, *args], timeout=900)  # the arm's env sets VLLM_CPU_KVCACHE_SPACE=1
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None, proc.stderr[-4000:]
    return json.loads(lines[-1]), proc.stderr


def test_the_override_scan_skips_objects_that_answer_any_attribute(arms: Arms) -> None:
    stock, _ = run(arms.stock, SCAN)
    assert stock is not None and stock["error"] is not None and "has no attribute 'get'" in stock["error"]
    patched, err = run(arms.patched, SCAN)
    assert patched is not None, err
    assert patched == {"error": None, "owner": True, "copy": True}  # both kinds of holder still rebound


def test_an_engine_starts_after_numba_is_imported(arms: Arms, model: Path) -> None:
    stock, err = run(arms.stock, NUMBA_FIRST, str(model))
    assert stock is None and FAILURE in err  # stock cannot start
    patched, err = run(arms.patched, NUMBA_FIRST, str(model))
    assert patched is not None, err
    plain, err = run(arms.stock, PLAIN, str(model))
    assert plain is not None, err
    assert patched["tokens"] == plain["tokens"]  # and it generates stock's tokens


def test_an_engine_starts_after_an_n_gram_engine_in_the_same_process(arms: Arms, model: Path) -> None:
    stock, err = run(arms.stock, AFTER_NGRAM, str(model))
    assert stock is None and FAILURE in err  # stock: the second engine cannot start
    patched, err = run(arms.patched, AFTER_NGRAM, str(model))
    assert patched is not None, err
    assert patched["numba"] is True
    assert patched["second"] == patched["ngram"]  # greedy: the same tokens with and without speculation
