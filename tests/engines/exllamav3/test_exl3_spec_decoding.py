"""Speculative-decoding patches (drafter input path, MTP head), stock vs patched on the same inputs."""

from __future__ import annotations

from typing import Any

import pytest
from exl3_probes import run_cases

from overlay.check.envs import Arms


@pytest.mark.parametrize(
    "payload",
    [{"seed": 0, "rounds": 20}, {"seed": 1, "rounds": 20, "bsz": 3, "scale": 2.5, "mask_embedding": True}],
    ids=["plain", "scaled-learned-mask-bsz3"],
)
def test_dflash_mask_rows_cached(arms: Arms, payload: dict[str, Any]) -> None:
    (stock,) = run_cases(arms.stock, "dflash_input.py", [payload])
    off, on = run_cases(
        arms.patched, "dflash_input.py", [payload, {**payload, "env": {"EXL3_OVL_DFLASH_MASK_CACHE": "1"}}]
    )
    assert off == stock
    # bit-identical block inputs and the same input_ids handed downstream
    assert on["digests"] == stock["digests"] and on["input_ids"] == stock["input_ids"]
    assert on["shape"] == stock["shape"] and on["dtype"] == stock["dtype"]
    bsz, rounds, block = payload.get("bsz", 1), payload["rounds"], stock["shape"][1]
    assert stock["embedded_rows"] == bsz * rounds * block
    assert on["embedded_rows"] == bsz * rounds + (block - 1)


def test_dflash_mask_rows_follow_the_embedding(arms: Arms) -> None:
    """0005's mask-row cache after the target's embedding module is freed and a new one (another table) takes its
    address: the block input is embedded from the new table, as stock does, not served from the freed one's."""
    payload = {"seed": 0, "rounds": 10, "swap": True}
    (stock,) = run_cases(arms.stock, "dflash_input.py", [payload])
    (on,) = run_cases(
        arms.patched, "dflash_input.py", [{**payload, "env": {"EXL3_OVL_DFLASH_MASK_CACHE": "1"}}]
    )
    assert stock["id_reused"] is True and on["id_reused"] is True  # the hazard really happened
    assert on["digests"] == stock["digests"]
    block = stock["shape"][1]
    assert on["embedded_rows"] == payload["rounds"] + 2 * (block - 1)  # mask rows embedded once per table


def test_mtp_dir_reattaches_head(arms: Arms) -> None:
    embedded_case = {"argv": ["-mtp"], "embedded": True}
    dropped_case = {"argv": ["-mtp"]}
    stock = run_cases(
        arms.stock, "mtp_dir.py", [embedded_case, dropped_case, {"argv": ["-mtp", "-mtpd", "{mtp}"]}]
    )
    patched = run_cases(
        arms.patched,
        "mtp_dir.py",
        [
            embedded_case,
            dropped_case,
            {"argv": ["-mtp", "-mtpd", "{mtp}"]},
            {"argv": ["-mtpd", "{mtp}"]},
            {"argv": ["-mtp", "-mtpd", "{mtp}"], "mtp_layers": 0},
        ],
    )
    embedded, dropped = stock[0], stock[1]
    # reference: the head's tensors in the model directory (unconverted layout): both arms build the MTP draft
    assert embedded["draft"] == "Glm4MoeLiteMTPModel" and patched[0] == embedded
    # converted model without the head: both arms refuse -mtp the same way
    assert "does not define a 'mtp' component" in dropped["error"] and patched[1] == dropped
    assert stock[2]["error"].startswith("argparse")

    # patched: --mtp_dir re-attaches it; head tensors from the MTP dir, trunk tensors from the model dir
    attached, no_mtp, no_layers = patched[2:]
    assert attached["draft"] == embedded["draft"]
    assert attached["where"]["model.layers.2.eh_proj.weight"] == {"has": True, "dir": "mtp"}
    assert attached["where"]["model.layers.2.enorm.weight"] == {"has": True, "dir": "mtp"}
    assert attached["where"]["model.embed_tokens.weight"] == {"has": True, "dir": "model"}
    assert "needs --mtp" in no_mtp["error"]
    assert "no MTP component" in no_layers["error"]


def test_mtp_dir_takes_only_mtp_tensors(arms: Arms) -> None:
    """--mtp_dir pointing at a whole checkpoint (the original model): the head's tensors come from there, every
    trunk tensor from the model directory (never the other checkpoint's embeddings, head or norms), and the trunk
    names found there are listed as refused."""
    (embedded,) = run_cases(arms.stock, "mtp_dir.py", [{"argv": ["-mtp"], "embedded": True}])
    (whole,) = run_cases(arms.patched, "mtp_dir.py", [{"argv": ["-mtp", "-mtpd", "{mtp}"], "whole": True}])
    assert whole["draft"] == embedded["draft"] == "Glm4MoeLiteMTPModel"
    where = whole["where"]
    assert where["model.layers.2.eh_proj.weight"] == {"has": True, "dir": "mtp"}
    assert where["model.embed_tokens.weight"] == {"has": True, "dir": "model"}
    assert where["lm_head.weight"] == {"has": True, "dir": "model"}
    # trunk names the model does not have are not served from the other checkpoint either
    assert where["model.layers.0.mlp.gate_proj.weight"]["has"] is False
    assert where["model.norm.weight"]["has"] is False
    assert whole["refused"] == sorted(
        [
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.norm.weight",
        ]
    )


def test_parallel_draft_load(arms: Arms) -> None:
    cases: list[dict[str, Any]] = [{"argv": []}, {"argv": ["-gs", "20"]}]
    stock = run_cases(arms.stock, "load_order.py", cases + [{"argv": ["-gs", "20", "-pl"]}])
    patched = run_cases(
        arms.patched, "load_order.py", cases + [{"argv": ["-gs", "20", "-pl"]}, {"argv": ["-pl"]}]
    )
    # off: same order (drafter first), thread and arguments as stock
    for s, p in zip(stock[:2], patched[:2]):
        assert s["order"] == ["DFlash2Model", "LlamaModel"] and s["threads"] == ["main", "main"]
        assert p == s
    assert stock[2]["error"].startswith("argparse")

    parallel, refused = patched[2:]
    assert parallel["overlap"] is True and parallel["threads"] == ["worker", "main"]
    assert parallel["kwargs"] == stock[1]["kwargs"]
    assert "explicit --gpu_split" in refused["error"]


def test_block_drafter_interface(arms: Arms) -> None:
    dflash_cases = [
        {"seed": 0},
        {"seed": 1, "bsz": 3, "window": 4},
        {"seed": 2, "conf_len": 3},
        {"seed": 3, "conf_len": 0},
    ]
    propose_cases = [{**c, "drafter": "propose"} for c in dflash_cases[:2]]
    stock = run_cases(arms.stock, "dflash_round.py", dflash_cases + propose_cases)
    patched = run_cases(arms.patched, "dflash_round.py", dflash_cases + propose_cases)
    # the DFlash round itself is unchanged: same calls, params, drafts, page tables and lengths
    assert patched[:4] == stock[:4]
    assert stock[0]["calls"][0][0] == "forward" and len(stock[0]["draft"][0]) == 7
    assert stock[2]["draft"] is not None and len(stock[2]["draft"][0]) == 3
    assert stock[3]["draft"] is None  # confidence 0: no draft this round
    # a drafter with only propose_block (caps["block_drafter"]) plugs in on the patched generator
    for s, p, ref in zip(stock[4:], patched[4:], stock[:2]):
        assert s["error"].startswith("AttributeError")
        assert p["calls"][0][0] == "propose_block" and p["calls"][0][1:] == ref["calls"][0][1:]
        assert {k: v for k, v in p.items() if k != "calls"} == {k: v for k, v in ref.items() if k != "calls"}
