"""Write a tiny random mlx-lm model of any family mlx-lm builds (its own module's initialisation, seeded), for the
census variants of families the bundled tiny models (overlay.check.models) do not cover. Runs inside an mlx-lm arm
(stdin: JSON payload, stdout: one JSON document); not imported by overlay itself.

Payload: {"config": mlx-lm config dict, "out": folder, "tokenizer_from": a model folder whose tokenizer files are copied
(its vocabulary must cover the config's), "seed": int}. Result: {"model": out}. Written to a scratch folder next to
``out`` and renamed into place, so a folder with a config.json is complete.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def main() -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    payload = json.load(sys.stdin)
    out = Path(payload["out"])
    if not (out / "config.json").is_file():
        config = payload["config"]
        mx.random.seed(int(payload.get("seed", 0)))
        model_class, args_class = _get_classes(config)
        model = model_class(args_class.from_dict(config))
        weights = dict(tree_flatten(model.parameters()))
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            mx.save_safetensors(str(scratch / "model.safetensors"), weights, metadata={"format": "mlx"})
            for name in TOKENIZER_FILES:
                src = Path(payload["tokenizer_from"]) / name
                if src.is_file():
                    shutil.copyfile(src, scratch / name)
            (scratch / "config.json").write_text(json.dumps(config, indent=1))
            scratch.rename(out)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    print(json.dumps({"model": str(out)}))


if __name__ == "__main__":
    main()
