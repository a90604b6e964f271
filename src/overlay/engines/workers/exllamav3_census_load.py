"""ExLlamaV3 census scenario ``drafter-load``: the device memory model_init's caches take, target and drafter.

What runs: the wheel's own ``model_init.add_args`` + ``model_init.init`` on a tiny synthetic Llama target and DFlash2
drafter (tests/engines/exllamav3/probes/_common.py; their checkpoints hold only the embedding and the drafter's fc),
with the request's CLI options (``--draft_window``, ``--draft_cache_quant``, ...) and the patch's environment switches:
argument handling, model construction and the construction of both caches (paged layers, window rings, quantized or
not) are the wheel's. The loader is stood in: ``Model.load`` does what the wheel's attention modules' ``load_local``
does for caches and nothing else (every module's ``cache_layers`` and ``recurrent_layers`` allocated with their own
``alloc(device)`` on the census device, the attached caches marked initialized, as ``Model.load_gen`` ends); no weight
is loaded (an EXL3 linear needs the CUDA extension) and ``Model.warmup`` does nothing. So ``peak-memory`` is the peak of
live device bytes the caches' own allocation code makes, the same target cache in every arm; the weights' bytes, which
no drafter-KV patch changes, are not in it.

Request: a CensusRequest with scenario "drafter-load", "drafter_layers" "ring" (the checkpoint's drafter layers are
"sliding_attention", window 256) or "paged" ("full_attention"), "options" the model_init CLI options; one load is one
step (``steps`` is ignored). Fixed inputs: ``-cs 65536`` (a cache of 65536 tokens for the target, and for the drafter
as model_init sizes it), 3 drafter layers of 2 KV heads x 64.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from census_sites import census_record, judged_flags

SCENARIO = "drafter-load"
CACHE_TOKENS = 65536
DRAFTER_LAYERS = 3
STANDIN = (
    "the loader: Model.load allocates every module's cache_layers and recurrent_layers through their own alloc() and "
    "loads no weight (the tiny checkpoints hold only the embedding and fc); Model.warmup does nothing"
)
LAYER_TYPES = {"ring": "sliding_attention", "paged": "full_attention"}


def _modules(module: Any) -> Iterator[Any]:
    yield module
    for sub in getattr(module, "modules", None) or ():
        yield from _modules(sub)


def _argv(options: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for name, value in sorted(options.items()):
        argv += [name] if value is None else [name, str(value)]
    return argv


def _refuse(message: str) -> NoReturn:
    raise argparse.ArgumentError(None, message)


def _cache_doc(cache: Any) -> dict[str, Any]:
    if cache is None:
        return {}
    layers = list(cache.layers.values())
    rings = list(cache.recurrent_layers.values())
    return {
        "paged_types": sorted({type(layer).__name__ for layer in layers}),
        "ring_types": sorted({type(layer).__name__ for layer in rings}),
        "max_num_tokens": int(cache.max_num_tokens),
    }


def load_census(
    request: Any, census_cls: Any, device_class: Any, recording_environ: Any, skip: tuple[str, ...]
) -> dict[str, Any]:
    import torch
    from _common import tiny_dflash2, tiny_llama
    from exllamav3 import Model, model_init

    layers = request.get("drafter_layers", "ring")
    if layers not in LAYER_TYPES:
        raise SystemExit(
            f"exllamav3 census: drafter_layers {layers!r}; expected one of {', '.join(LAYER_TYPES)}"
        )
    if request.get("ring_bits") is not None:
        raise SystemExit(
            "exllamav3 census: drafter-load takes no ring_bits (quantized rings come from --draft_cache_quant "
            "with EXL3_OVL_SWA_RING=1, as model_init makes them)"
        )
    device = torch.device("cpu", 0)  # the census's spelling of the device (_devsim.CensusDev)
    c = census_cls(placement="is_cuda", device_class=device_class, skip=skip)

    drafter_dir: list[str] = []
    before: dict[str, int] = {}

    def load(self: Any, *args: Any, **kwargs: Any) -> None:
        # the drafter's load is the scenario's step; the target's is counted apart (model_init loads the drafter first)
        tag = "load" if str(self.config.directory) in drafter_dir else "target-load"
        before[tag] = c._live
        with c.step(tag):
            for module in _modules(self):
                for layer in getattr(module, "cache_layers", None) or ():
                    layer.alloc(device)
                for layer in getattr(module, "recurrent_layers", None) or ():
                    layer.alloc(device)
        for ref in self.cache_weakrefs.values():
            cache = ref()
            if cache is not None:
                cache.initialized = True

    saved = Model.load, Model.warmup
    Model.load = load
    Model.warmup = lambda self, *a, **k: []
    plain_environ = os.environ.__class__
    try:
        with tempfile.TemporaryDirectory() as tmp:
            target = tiny_llama(Path(tmp) / "target")
            draft = tiny_dflash2(Path(tmp) / "draft", layer_types=[LAYER_TYPES[layers]] * DRAFTER_LAYERS)
            drafter_dir.append(str(draft))
            parser = argparse.ArgumentParser(exit_on_error=False)
            parser.error = _refuse  # type: ignore[method-assign]  # no usage text on stderr: one clear error
            model_init.add_args(parser, add_draft_model_args=True)
            argv = [
                "-m",
                str(target),
                "-dm",
                str(draft),
                "-cs",
                str(CACHE_TOKENS),
                *_argv(dict(request.get("options") or {})),
            ]
            try:
                args = parser.parse_args(argv)
            except (argparse.ArgumentError, SystemExit) as e:
                raise SystemExit(
                    f"exllamav3 census: this wheel's model_init refuses {argv[6:]}: {e}"
                ) from None
            os.environ.__class__ = recording_environ
            try:
                with c:
                    out = model_init.init(args, load_tokenizer=False, quiet=True, progress=False)
            except ValueError as e:  # model_init's own refusals (--draft_window on a drafter without rings)
                raise SystemExit(f"exllamav3 census: model_init refused {argv[6:]}: {e}") from None
            cache, draft_cache = out[2], out[-1]
            detail: dict[str, Any] = {"cache": _cache_doc(cache), "draft_cache": _cache_doc(draft_cache)}
            del out, cache, draft_cache
    finally:
        os.environ.__class__ = plain_environ
        Model.load, Model.warmup = saved
    report = c.report(tag="load")
    target = c.report(tag="target-load")["metrics"]["peak-memory"]
    detail["target_cache_bytes"] = int(target) - before.get("target-load", 0)
    detail["live_before_drafter_load"] = before.get("load")
    metrics = dict(report["metrics"])
    options_text = " ".join(argv[6:]) or "none"
    notes = [
        (
            f"-cs {CACHE_TOKENS}, drafter: {DRAFTER_LAYERS} {LAYER_TYPES[layers]} layers (window 256) of 2 KV "
            f"heads x 64; options: {options_text}"
        ),
        (
            f"draft cache: {detail['draft_cache']}; the target's cache ({detail['target_cache_bytes']} B, the same "
            f"in every arm) is counted apart (step target-load); {detail['live_before_drafter_load']} B were live "
            "when the drafter's load began"
        ),
    ]
    flagged, metrics = judged_flags(
        "EXL3_OVL_", recording_environ.read, "while model_init built the caches", metrics
    )
    notes += flagged
    return census_record(SCENARIO, report, metrics, notes, standin=STANDIN, detail=detail)
