"""Worker of scripts/mac_check.py: runs generation cases in one interpreter (a stock or a patched mlx-lm venv).

Reads a JSON payload on stdin: {"model", "draft_model" | null, "mtp_model" | null, "mtp_drafter" | null (a split
MTP drafter folder: the MTP cases load it as the head of "model"), "prompts": [text, ...],
"tokens": n, "seeds": [s, ...], "cases": [{"id", "kind": "serial" | "serial-mtp" | "draft" | "mtp", "k", "temp"}]}.
Prints one JSON document: {"mlx_lm": version, "mlx": version, "device": default device, "cases": {id: {"runs":
[{"prompt", "seed", "tokens", "from_draft", "decode_tps", "seconds"}], "error"?}}}. Standard library + mlx-lm only.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any


def main() -> None:
    payload = json.loads(sys.stdin.read())
    import importlib.metadata

    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    loaded: dict[tuple[str, bool, str | None], Any] = {}

    def get(path: str, keep_mtp: bool = False, mtp_path: str | None = None) -> Any:
        key = (path, keep_mtp, mtp_path)
        if key not in loaded:
            config: dict[str, Any] = (
                {"mtp_path": mtp_path} if mtp_path else {"keep_mtp": True} if keep_mtp else {}
            )
            loaded[key] = load(path, model_config=config) if config else load(path)
        return loaded[key]

    out: dict[str, Any] = {
        "mlx_lm": importlib.metadata.version("mlx-lm"),
        "mlx": importlib.metadata.version("mlx"),
        "device": str(mx.default_device()),
        "cases": {},
    }
    for case in payload["cases"]:
        runs = []
        try:
            kwargs: dict[str, Any] = {}
            if case["kind"] == "mtp" and payload.get("mtp_drafter"):
                model, tok = get(payload["model"], mtp_path=payload["mtp_drafter"])
                kwargs = {"draft_kind": "mtp", "num_draft_tokens": case["k"]}
            elif case["kind"] == "mtp":
                model, tok = get(payload["mtp_model"], keep_mtp=True)
                kwargs = {"draft_kind": "mtp", "num_draft_tokens": case["k"]}
            elif case["kind"] == "serial-mtp":
                model, tok = get(payload["mtp_model"])
            else:
                model, tok = get(payload["model"])
                if case["kind"] == "draft":
                    kwargs = {"draft_model": get(payload["draft_model"])[0], "num_draft_tokens": case["k"]}
            seeds = [0] if case["temp"] == 0 else payload["seeds"]
            for p, text in enumerate(payload["prompts"]):
                for seed in seeds:
                    mx.random.seed(seed)
                    tokens, flags, tps = [], [], 0.0
                    tic = time.perf_counter()
                    for resp in stream_generate(
                        model,
                        tok,
                        text,
                        max_tokens=payload["tokens"],
                        sampler=make_sampler(case["temp"]),
                        **kwargs,
                    ):
                        tokens.append(int(resp.token))
                        flags.append(bool(getattr(resp, "from_draft", False)))
                        tps = float(resp.generation_tps)
                    runs.append(
                        {
                            "prompt": p,
                            "seed": seed,
                            "tokens": tokens,
                            "from_draft": flags,
                            "decode_tps": tps,
                            "seconds": time.perf_counter() - tic,
                        }
                    )
            out["cases"][case["id"]] = {"runs": runs}
        except Exception:
            out["cases"][case["id"]] = {"runs": runs, "error": traceback.format_exc()[-1500:]}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
