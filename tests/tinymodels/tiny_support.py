"""Shared helpers of the tiny-model tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PROBES = Path(__file__).resolve().parent / "probes"
RANDOM_KINDS = (
    "llama-random",
    "llama-draft-random",
    "qwen3_5-random",
    "deepseek_v3-random",
    "olmo3-swa-random",
)


@dataclass(frozen=True)
class Interpreter:
    """An interpreter plus the environment it runs probes with (a probe reads JSON on stdin, prints JSON)."""

    python: Path
    env: Mapping[str, str]

    def probe(self, script: str, payload: Any, timeout: float = 900) -> Any:
        proc = subprocess.run(
            [str(self.python), str(PROBES / script)],
            input=json.dumps(payload),
            check=False,
            capture_output=True,
            text=True,
            env=dict(self.env),
            timeout=timeout,
        )
        assert proc.returncode == 0, f"{script} failed:\n{proc.stderr[-4000:]}"
        return json.loads(proc.stdout.strip().splitlines()[-1])
