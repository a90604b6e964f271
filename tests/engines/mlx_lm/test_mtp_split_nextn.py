"""Split nextn MTP drafters (patch models: load a split MTP drafter folder as the model's MTP head). Stock vs patched.

Besides the Qwen drafters (test_mtp_split.py), two nextn-style drafter layouts are published for families the series
drafts with: mlx-vlm's ``glm4_moe_lite_mtp`` (GLM-4.7-Flash; flat names under ``model.``, the decoder block under
``model.mtp_block.``) and ``glm_moe_dsa_mtp`` (GLM-5; flat names under ``mtp.``). probes/mtp_split_nextn.py writes
both from the tiny Hugging Face checkpoints of probes/mtp_build.py (``glm4_moe_lite``, ``glm_moe_dsa``: a nextn layer
``model.layers.{N}.*``); the target is a stock conversion without MTP weights.

- Loaded with ``model_config={"mtp_path": DRAFTER}`` the patched arm attaches the head, and its MTP logits are bit for
  bit those of the checkpoint's own nextn layer (``keep_mtp``), in both layouts; the target's logits do not change;
  stock ignores the key (no head).
- A 4-bit split (every projection quantized, as the splitters' ``--q-bits``) next to the fp32 target loads with its
  head quantized on its own, the target's logits unchanged.
- A nextn drafter next to a target of another family is refused, naming both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_mtp_loading import TOKENS, build_families

from overlay.check.envs import Arms

PROBES = Path(__file__).parent / "probes"
SPLIT = PROBES / "mtp_split_nextn.py"
LOAD = PROBES / "mtp_split.py"
SIDECAR = PROBES / "mtp_sidecar.py"
LAYOUTS = {"glm4_moe_lite": "model", "glm_moe_dsa": "mtp"}
Q4 = {"bits": 4, "group_size": 32}


@pytest.fixture(scope="module")
def built(arms: Arms, repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    families = build_families(arms, repo_root)
    out = tmp_path_factory.mktemp("mtp-split-nextn")
    dirs: dict[str, dict[str, str]] = {}
    convert, split = [], []
    for family, layout in LAYOUTS.items():
        src = families[family]["dir"]
        d = {k: str(out / f"{family}-{k}") for k in ("plain", "split", "split-q4")}
        d["src"] = src
        dirs[family] = d
        convert.append({"src": src, "dst": d["plain"], "keep": False, "quantize": None})
        split += [
            {"src": src, "dst": d["split"], "layout": layout, "quantize": None},
            {"src": src, "dst": d["split-q4"], "layout": layout, "quantize": Q4},
        ]
    arms.stock.run_json(SIDECAR, {"mode": "convert", "jobs": convert})
    written = arms.stock.run_json(SPLIT, {"jobs": split})
    return {"dirs": dirs, "written": written}


def _load(arm: Any, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = arm.run_json(LOAD, {"mode": "load", "jobs": jobs, "tokens": TOKENS})
    return result


def test_nextn_split_drafters_load_as_the_mtp_head(arms: Arms, built: dict[str, Any]) -> None:
    for family, layout in LAYOUTS.items():
        d = built["dirs"][family]
        names = built["written"][d["split"]]["tensors"]
        assert built["written"][d["split"]]["model_type"] == f"{family}_mtp"
        if layout == "model":
            assert "model.eh_proj.weight" in names and "lm_head.weight" in names
            assert any(n.startswith("model.mtp_block.") for n in names)
        else:
            assert "mtp.eh_proj.weight" in names and "mtp.shared_head_norm.weight" in names
        assert any(".switch_mlp." in n for n in names) and any(".embed_q." in n for n in names)
        jobs = [
            {"model": d["src"], "config": {"keep_mtp": True}},  # 0: the checkpoint's own nextn layer
            {"model": d["plain"], "config": None},  # 1: the target alone
            {"model": d["plain"], "config": {"mtp_path": d["split"]}},  # 2
            {"model": d["plain"], "config": {"mtp_path": d["split-q4"]}},  # 3
        ]
        patched = _load(arms.patched, jobs)
        errors = [(i, r["error"]) for i, r in enumerate(patched) if "error" in r]
        assert not errors, (family, errors)
        ref, plain, split, q4 = patched
        assert ref["has_mtp"] and not plain["has_mtp"], family
        assert split["has_mtp"] and split["mtp_logits"] == ref["mtp_logits"], (
            f"{family}: the split head differs from the checkpoint's own"
        )
        assert split["logits"] == plain["logits"] == ref["logits"], family
        assert split["quantized"] == 0
        assert q4["has_mtp"] and q4["quantized"] > 0, (family, q4)
        assert q4["logits"] == plain["logits"], f"{family}: the fp32 target stays unquantized"
        stock = _load(arms.stock, [{"model": d["plain"], "config": {"mtp_path": d["split"]}}])
        assert stock[0]["logits"] == plain["logits"] and not stock[0]["has_mtp"], family


def test_nextn_drafter_of_another_family_is_refused(arms: Arms, built: dict[str, Any]) -> None:
    lite, dsa = built["dirs"]["glm4_moe_lite"], built["dirs"]["glm_moe_dsa"]
    refused = _load(arms.patched, [{"model": lite["plain"], "config": {"mtp_path": dsa["split"]}}])
    assert "glm_moe_dsa_mtp" in refused[0]["error"] and "glm4_moe_lite" in refused[0]["error"], refused
