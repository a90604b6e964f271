"""Probe: defaults of the public generation API that API callers rely on.

Payload: {}. Result: {"speculative_prefill_step_size": default of speculative_generate_step's prefill_step_size,
"generate_step_prefill_step_size": the same of generate_step}.
"""

from __future__ import annotations

import importlib
import inspect

from probe_io import emit

if __name__ == "__main__":
    gen = importlib.import_module("mlx_lm.generate")
    emit(
        {
            name + "_prefill_step_size": inspect.signature(getattr(gen, fn))
            .parameters["prefill_step_size"]
            .default
            for name, fn in (("speculative", "speculative_generate_step"), ("generate_step", "generate_step"))
        }
    )
