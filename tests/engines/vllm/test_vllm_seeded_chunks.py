"""0011: a seeded request whose prompt is prefilled over several steps, on vLLM's CPU build. Long: four engine starts
(two per arm), ~2 minutes on the 2-core machine.

Each step samples a token for every request, and the model runner discards the sample of a request still prefilling
its prompt; for a seeded request it then rewinds the request's generator "as if the token was not sampled" with
``gen.set_offset(gen.get_offset() - 4)`` (CUDA's Philox offset). A CPU generator has no offset: stock raises
"CPU Generator does not use offset" and the request fails. With the patch the runner keeps a CPU generator's state
before sampling and sets it back for a discarded sample.

- stock: a seeded sampled request with a 200-token prompt and ``max_num_batched_tokens`` 64 (its prompt in four
  chunks) fails with that error; the same request with the prompt in one step runs;
- the series: the chunked request runs and samples the same tokens as the request prefilled in one step (the
  discarded samples leave the generator as it was), and those are stock's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from overlay.check.envs import Arms

pytestmark = pytest.mark.long

RUN = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import vllm_worker
from vllm import SamplingParams

prompt = [1 + (i * 37) % 500 for i in range(200)]
params = [SamplingParams(temperature=0.7, seed=5 + i, max_tokens=16, ignore_eos=True) for i in range(2)]
out = {}
for name, budget in (("chunked", 64), ("whole", 8192)):
    llm = vllm_worker._llm(
        sys.argv[2], engine_args={"max_num_batched_tokens": budget, "enable_chunked_prefill": True, "max_num_seqs": 4}
    )
    try:
        res = llm.generate([{"prompt_token_ids": prompt}] * 2, params, use_tqdm=False)
        out[name] = [list(r.outputs[0].token_ids) for r in res]
    except Exception as err:  # the engine's error, reported
        out[name] = f"{type(err).__name__}: {err}"
    finally:
        vllm_worker._shutdown(llm)
print(json.dumps(out))
"""
WORKERS = Path(__file__).resolve().parents[3] / "src" / "overlay" / "engines" / "workers"


@pytest.fixture(scope="module")
def runs(arms: Arms, model: Path) -> dict[str, dict[str, Any]]:
    return {
        "stock": arms.stock.run_code_json(RUN, str(WORKERS), str(model)),
        "series": arms.patched.run_code_json(RUN, str(WORKERS), str(model)),
    }


def test_stock_fails_a_seeded_request_prefilled_in_chunks(runs: dict[str, dict[str, Any]]) -> None:
    stock = runs["stock"]
    assert isinstance(stock["chunked"], str) and "CPU Generator does not use offset" in stock["chunked"]
    assert isinstance(stock["whole"], list) and all(len(t) == 16 for t in stock["whole"])


def test_the_series_samples_as_if_the_prompt_were_prefilled_at_once(runs: dict[str, dict[str, Any]]) -> None:
    series, stock = runs["series"], runs["stock"]
    assert series["chunked"] == series["whole"] == stock["whole"]
    assert series["whole"][0] != series["whole"][1]  # two seeds, two draws
