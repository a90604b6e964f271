"""Probe: build the tiny models of the speculative-decoding tests once (run in the stock arm).

Payload: {"out": folder}. Result: {"models": {name: folder}} (see spec_common.MODELS; cached by content).
"""

from __future__ import annotations

from probe_io import emit, read_payload
from spec_common import build_set

if __name__ == "__main__":
    emit({"models": build_set(read_payload()["out"])})
