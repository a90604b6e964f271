"""ExLlamaV3 census scenario ``prefill-chunk`` (called by exllamav3_census.py's ``census()``; runs inside an exllamav3
arm with the labelled stand-in extension).

What runs: the wheel's own ``dflash_update_kv_from_target`` (exllamav3/architecture/dflash.py, through
``DFlash2Model.update_kv_from_target``) on a tiny DFlash2 drafter built from a config by the wheel's
``Model.from_config``, every layer a window ring (``sliding_attention``, window 256, as ``--draft_window`` makes of
a DFlash drafter), over prefill chunks of CHUNK rows at bsz 1, one census step per chunk: the tap reordering, the
upload of the job's host positions and block table (``get_for_device``), the ring plan (``plan_state_rows``), the
window writes (``write_state_rows``, the shift or the modular ring's code) and the commit are the wheel's. What is
stood in (the same in every arm; tests/engines/exllamav3/probes/dflash_prefill.py builds this world, also for
test_exl3_drafter_kv.py::test_dflash_prefill_crop): the drafter's fc, k_proj and v_proj (one fp16 matmul each, an
fp16 weight where the EXL3 kernel reads a quantized one), hidden_norm (an RMS norm in a few torch ops, the
extension's one kernel) and RoPE (a position-dependent rotation in torch ops, the extension's one kernel), and the
target's tapped hidden states (random fp16 rows on the device, what the target's prefill exports). Device tensors
are ``_devsim.CensusDev``; the census counts with ``placement="is_cuda"``.

Request fields read here: "steps" (chunks counted, after WARMUP chunks), "chunk" (rows per chunk, default CHUNK),
"drafter_layers" ("ring" only: a paged drafter layer writes through the extension's paged-cache kernel, which the
CPU census does not run, and the crop is off with any paged layer). bsz is 1 (a job prefills one sequence);
"ring_bits" and model_init options are refused.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from census_sites import census_record, judged_flags

SCENARIO, TAG = "prefill-chunk", "prefill"
CHUNK = 2048  # the generator's default chunk_size
WINDOW, LAYERS = 256, 3
WARMUP = 1  # the first chunk starts at position 0 (nothing in the window to shift yet): left out of the means
FLAG_PREFIX = "EXL3_OVL_"
STANDIN = (
    "the drafter's fc, hidden_norm, k_proj, v_proj and RoPE (torch device ops: one fp16 matmul per projection, an "
    "RMS norm, a position-dependent rotation) and the target's tapped hidden states (random fp16 device rows); the "
    "update, ring plan and window writes are the wheel's"
)
NOT_COUNTED = {
    "collectives": "no tensor-parallel path runs on CPU",
    "cache-hits": "no engine cache entry point is wrapped by the census",
    "capturable": "a prefill chunk runs eagerly (no engine capture region around it)",
}


def prefill_chunk(request: Any, *, environ: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The census record of ``steps`` prefill chunks; ``environ``: the os.environ class that records the
    EXL3_OVL_* switches the engine reads (exllamav3_census._RecordingEnviron); ``options``: the request's model_init
    options (none is run here)."""
    if options:
        raise SystemExit(
            f"exllamav3 census: prefill-chunk runs no model_init option (got {sorted(options)}): the drafter's "
            "prefill K/V update does not involve them"
        )
    if request.get("drafter_layers", "ring") != "ring":
        raise SystemExit(
            f"exllamav3 census: prefill-chunk needs drafter_layers 'ring' (got {request.get('drafter_layers')!r}): "
            "a paged drafter layer's prefill write is the extension's paged-cache kernel, not run on CPU"
        )
    for field, allowed in (("bsz", (None, 1)), ("ring_bits", (None,))):
        if request.get(field) not in allowed:
            raise SystemExit(
                f"exllamav3 census: prefill-chunk does not take {field}={request.get(field)!r} (a job prefills one "
                "sequence, into fp16 window rings here)"
            )
    steps = int(request["steps"])
    chunk = int(request.get("chunk", CHUNK))
    if not 1 <= steps <= 64 or not 1 <= chunk <= 65536:
        raise SystemExit(
            f"exllamav3 census: prefill-chunk steps {steps} / chunk {chunk}: expected 1..64 / 1..65536"
        )

    import _devsim
    import dflash_prefill
    import exllamav3.ext as ext_mod
    from torch_census import Census

    standin = ext_mod.exllamav3_ext
    c = Census(placement="is_cuda", device_class=_devsim.CensusDev, skip=(_devsim.__file__,))
    payload = {
        "seed": 7,
        "chunks": [chunk] * (steps + WARMUP),
        "layer_types": ["sliding_attention"] * LAYERS,
        "window": WINDOW,
    }

    @contextlib.contextmanager
    def around(i: int) -> Iterator[None]:
        before = standin.calls.copy()
        with c.step(TAG):
            yield
            for kernel, n in (standin.calls - before).items():
                c.count("eager-launches", n, kind=f"exllamav3_ext.{kernel}", site=f"exllamav3_ext.{kernel}")

    plain_environ = os.environ.__class__
    os.environ.__class__ = environ
    try:
        with c:
            out = dflash_prefill.prefill(
                payload, dev=lambda t: t.as_subclass(_devsim.CensusDev), around=around
            )
    finally:
        os.environ.__class__ = plain_environ
    report = c.report(tag=TAG, skip=WARMUP)
    metrics = dict(report["metrics"])
    for metric in NOT_COUNTED:
        metrics[metric] = None
    counted = out["per_chunk"][WARMUP:]
    kept = max(out["kv_state_size"])
    notes = [
        (
            f"bsz 1, {steps} prefill chunks of {chunk} rows after {WARMUP} warm-up chunk; drafter: {LAYERS} "
            f"window-ring layers (sliding_attention, window {WINDOW}, kv_state_size {kept}), 2 target taps, hidden 64"
        ),
        "rows through fc per chunk: "
        + ", ".join(str(p["fc_rows"]) for p in counted)
        + f"; through k_proj + v_proj (all layers): {', '.join(str(p['kv_rows']) for p in counted)}",
        (
            "peak-memory / alloc-bytes / gemm-bytes count the stand-ins' tensors: fp16 weights where EXL3 reads "
            "quantized ones, float temporaries of the stood-in norm and RoPE where the extension runs one kernel each"
        ),
    ]
    flagged, metrics = judged_flags(
        FLAG_PREFIX, environ.read, "on this scenario's CPU path (the drafter's prefill K/V update)", metrics
    )
    notes += flagged
    notes += [f"{m}: not counted ({why})" for m, why in NOT_COUNTED.items()]
    detail = {
        "per_chunk": counted,
        "kv_state_size": out["kv_state_size"],
        "after": out["after"],
        "chunk": chunk,
        "violations": report["violations"][:5],
    }
    return census_record(SCENARIO, report, metrics, notes, standin=STANDIN, detail=detail, steps=steps)
