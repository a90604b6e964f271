"""Paths of the exllamav3 probes (scripts run inside a stock or patched arm; see probes/_common.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROBES = Path(__file__).resolve().parent / "probes"


def probe(name: str) -> Path:
    return PROBES / name


def run_cases(arm: Any, name: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run several payloads through one probe process (probes built on _common.run_cases)."""
    return list(arm.run_json(probe(name), {"cases": cases})["cases"])
