"""Run the ``cold-start`` census (src/overlay/engines/workers/vllm_cold.py) in a vLLM arm: one JSON request on stdin
(``model``, optional ``scenario``), the census result as one JSON document on stdout (vLLM's logs go to stderr).

    ARM/bin/python tests/engines/vllm/probes/cold_start.py < request.json

vLLM's spawned children import this file again as ``__mp_main__``: everything that acts is under the guard.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

WORKERS = Path(__file__).resolve().parents[4] / "src" / "overlay" / "engines" / "workers"


def main() -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    req = json.loads(sys.stdin.read())
    req.setdefault("task", "census")
    req.setdefault("scenario", "cold-start")
    req.setdefault("steps", 1)
    sys.path.insert(0, str(WORKERS))
    import vllm_cold

    result = vllm_cold.census(req)
    out.write(json.dumps(result) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
