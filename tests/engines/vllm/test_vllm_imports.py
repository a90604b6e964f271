"""0002 and 0003: what the engine's processes import at a cold start, stock vs patched (long: two cold starts of the
real engine through the check's ``cold-start`` census, 1-2 minutes each on the 2-core machine, and three short runs:
one in the patched arm, one in each arm).

- 0002: the engine core and the worker import none of the OpenAI server's protocol modules nor the ``openai``
  package's types (stock: 522 ``openai.*`` modules in each, through the reasoning parsers' MCP tool-server annotation
  and the structured-output manager's parser-engine adapter); the parent keeps them (``LLM.chat``'s renderer uses
  them);
- 0003: no process imports Inductor's lowering, code generators or networkx (stock: 181 ``torch._inductor.*`` and
  285 ``networkx.*`` modules in each, through vLLM's import-time Inductor patch, the compilation config's pass base
  class, module-level ``torch.compile`` decorators and the online-quantization lookup of an unquantized model);
  ``torch._dynamo`` stays (transformers imports it);
- both: ``module-imports`` in ``cold-start`` drops, and the engine's tokens are stock's;
- what the deferrals must keep: a ``compile_on_first_call`` function compiles at its first call and gives eager's
  result, also inlined into a compiled caller; a structured-output request is served as in stock.

Run with the stock wheel in the patched arm's place, the first three fail (stock's counts). Every cold start is a first
launch (the census's own empty ``VLLM_CACHE_ROOT``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arms

pytestmark = pytest.mark.long
ROLES = ("parent", "engine core", "worker")


def packages(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    counts = {p["role"]: p["packages"] for p in doc["detail"]["processes"] if p["counted"]}
    assert set(ROLES) <= set(counts), counts.keys()
    return counts


def test_engine_core_and_worker_import_no_openai_protocol_modules(cold: dict[str, dict[str, Any]]) -> None:
    stock, patched = packages(cold["stock"]), packages(cold["patched"])
    for role in ("engine core", "worker"):
        assert stock[role]["openai"] > 400 and stock[role]["vllm.parser"] > 0  # what stock imports there
        assert stock[role]["vllm.entrypoints"] > 0
        assert patched[role]["openai"] == 0, role
        assert patched[role]["vllm.parser"] == 0 and patched[role]["vllm.entrypoints"] == 0, role
    # the parent keeps the openai types: LLM's chat renderer (vllm.renderers.chat_utils) uses them
    assert patched["parent"]["openai"] == stock["parent"]["openai"] > 400


def test_no_process_imports_inductors_lowering_or_networkx(cold: dict[str, dict[str, Any]]) -> None:
    stock, patched = packages(cold["stock"]), packages(cold["patched"])
    for role in ROLES:
        # stock's premise
        assert stock[role]["torch._inductor.lowering"] == 1 and stock[role]["networkx"] > 200
        assert stock[role]["torch._inductor"] > 150
        assert patched[role]["torch._inductor.lowering"] == 0, role
        assert patched[role]["networkx"] == 0, role
        assert patched[role]["torch._inductor"] < 25, role  # the package and what torch._dynamo imports of it
        # not deferred: transformers imports it (torch.compiler.disable)
        assert patched[role]["torch._dynamo"] > 0


def test_module_imports_decrease_and_the_tokens_are_stocks(cold: dict[str, dict[str, Any]]) -> None:
    stock, patched = cold["stock"], cold["patched"]
    before, after = stock["metrics"]["module-imports"], patched["metrics"]["module-imports"]
    assert after < before - 2500, (before, after)  # measured: 15750 -> 12646
    assert patched["detail"]["first_token"] == stock["detail"]["first_token"]
    assert patched["detail"]["greedy"] == stock["detail"]["greedy"]


COMPILE_ON_FIRST_CALL = """
import json, sys
import torch
from vllm.utils.torch_utils import compile_on_first_call

loaded = "torch._inductor.lowering" in sys.modules
from torch._dynamo.utils import counters

def body(x):
    return (x * 2 + 1).sum(dim=-1)

def graphs_of(make):
    # dynamo's graph count after decorating, after each of two calls, and after a fullgraph caller's call
    torch._dynamo.reset()  # forget the other run's compiled code (dynamo caches it on the function's code)
    counters.clear()
    fn = make(body)
    seen = [counters["stats"]["unique_graphs"]]
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    results = [fn(x), fn(x + 1)]
    seen.append(counters["stats"]["unique_graphs"])
    results.append(torch.compile(lambda y: fn(y) - 1, backend="eager", fullgraph=True)(x))
    seen.append(counters["stats"]["unique_graphs"])
    expected = [body(x), body(x + 1), body(x) - 1]
    return seen, all(bool(torch.equal(r, e)) for r, e in zip(results, expected))

lazy = graphs_of(compile_on_first_call(backend="eager", dynamic=True))
plain = graphs_of(lambda f: torch.compile(f, backend="eager", dynamic=True))
print(json.dumps({
    "lowering_at_import": loaded,
    "lazy": lazy,
    "plain": plain,
    "lowering_at_end": "torch._inductor.lowering" in sys.modules,
}))
"""


def test_compile_on_first_call_compiles_at_first_call_and_inlines_in_a_compiled_caller(arms: Arms) -> None:
    out = arms.patched.run_code_json(COMPILE_ON_FIRST_CALL)
    assert out["lowering_at_import"] is False  # importing vllm's torch utilities imports no Inductor lowering
    (lazy_graphs, lazy_ok), (plain_graphs, plain_ok) = out["lazy"], out["plain"]
    assert lazy_ok and plain_ok  # eager's results, called directly and inlined into a fullgraph caller
    assert lazy_graphs[0] == 0 and lazy_graphs[1] > 0  # nothing compiled until the first call
    assert lazy_graphs == plain_graphs  # then dynamo compiles what torch.compile's own wrapper would
    assert out["lowering_at_end"] is False  # the eager backend never needs Inductor's lowering


STRUCTURED = """
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=512, enforce_eager=True, seed=0,
          distributed_executor_backend="uni")
choices = ["alpha", "beta", "gamma"]
params = SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=choices))
out = llm.generate([{"prompt_token_ids": [0, 5, 6, 7]}, {"prompt_token_ids": [0, 200, 201]}], params, use_tqdm=False)
print(json.dumps({"texts": [o.outputs[0].text for o in out], "ids": [list(o.outputs[0].token_ids) for o in out]}))
"""


def test_a_structured_output_request_is_served_as_in_stock(arms: Arms, model: Path) -> None:
    stock, patched = (arm.run_code_json(STRUCTURED, str(model)) for arm in (arms.stock, arms.patched))
    assert all(text in ("alpha", "beta", "gamma") for text in patched["texts"]), patched
    assert patched == stock
