"""MTP sidecar (patch mtp-sidecar-convert): ``mlx_lm.convert --keep-mtp`` and loading, stock vs patched.

Sources: the tiny qwen3_5 (``language_model.mtp``), qwen3_next (converted checkpoints skip its sanitize) and
deepseek_v3 (nextn layer) checkpoints of probes/mtp_build.py, converted in fp32 and 4-bit (group 32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_mtp_loading import TOKENS, build_families

from overlay.check.envs import Arms

PROBE = Path(__file__).parent / "probes" / "mtp_sidecar.py"
FAMILIES = ("qwen3_5", "qwen3_next", "deepseek_v3")
Q4 = {"bits": 4, "group_size": 32}


@pytest.fixture(scope="module")
def converted(arms: Arms, repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    models = build_families(arms, repo_root)
    out = tmp_path_factory.mktemp("mtp-sidecar")

    def jobs(tag: str, keep: bool) -> list[dict[str, Any]]:
        return [
            {
                "src": models[f]["dir"],
                "dst": str(out / f"{tag}-{f}-{q}"),
                "keep": keep,
                "quantize": Q4 if q == "q4" else None,
            }
            for f in FAMILIES
            for q in ("fp32", "q4")
        ]

    stock = arms.stock.run_json(PROBE, {"mode": "convert", "jobs": jobs("stock", False)})
    patched = arms.patched.run_json(PROBE, {"mode": "convert", "jobs": jobs("off", False) + jobs("on", True)})
    kept_dirs = [str(out / f"on-{f}-{q}") for f in FAMILIES for q in ("fp32", "q4")]
    originals = [models[f]["dir"] for f in FAMILIES]
    load = {"mode": "load", "dirs": kept_dirs + originals, "tokens": TOKENS}
    return {
        "out": out,
        "models": models,
        "stock": stock,
        "patched": patched,
        "stock_load": arms.stock.run_json(PROBE, {**load, "keep": False}),
        "off_load": arms.patched.run_json(PROBE, {**load, "keep": False}),
        "on_load": arms.patched.run_json(PROBE, {**load, "keep": True}),
    }


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("q", ["fp32", "q4"])
def test_convert_writes_sidecar(family: str, q: str, converted: dict[str, Any]) -> None:
    out = converted["out"]
    stock = converted["stock"][str(out / f"stock-{family}-{q}")]
    off = converted["patched"][str(out / f"off-{family}-{q}")]
    on = converted["patched"][str(out / f"on-{family}-{q}")]
    # Without keep_mtp, convert writes the stock files byte for byte (no sidecar).
    assert off == stock
    assert not [f for f in stock["files"] if f.startswith("mtp")]
    # With keep_mtp: the same main files (config aside: per-layer quantization entries of MTP layers), a sidecar.
    assert {k: v for k, v in on["files"].items() if k not in ("config.json", "mtp.safetensors")} == {
        k: v for k, v in stock["files"].items() if k != "config.json"
    }
    assert "mtp.safetensors" in on["files"] and on["sidecar"]
    assert "keep_mtp" not in on["config_keys"]
    assert all(".mtp." in k or k.startswith("mtp.") for k in on["sidecar"])

    kept_dir = str(out / f"on-{family}-{q}")
    stock_load = converted["stock_load"][kept_dir]
    off_load = converted["off_load"][kept_dir]
    on_load = converted["on_load"][kept_dir]
    # Stock mlx-lm loads the converted main files (ignoring the sidecar) with the patched arm's logits.
    assert "mtp.safetensors" not in stock_load["files_read"]
    assert stock_load["logits"] == off_load["logits"] == on_load["logits"]
    assert stock_load["params"] == off_load["params"]
    # The patched arm with keep_mtp reads the sidecar and gets the head.
    assert "mtp.safetensors" in on_load["files_read"] and on_load["has_mtp"]
    head_projection = "fc" if family.startswith("qwen") else "layers.0.eh_proj"
    assert head_projection in on_load["unquantized"], "fc / eh_proj stay unquantized"
    if q == "q4":
        assert on_load["quantized"] > 0, "the rest of the MTP head follows the quantization predicate"
    else:
        original = converted["on_load"][converted["models"][family]["dir"]]
        assert on_load["mtp_logits"] == original["mtp_logits"], "fp32 sidecar: same MTP logits as the source"
