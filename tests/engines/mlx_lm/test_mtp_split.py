"""Split MTP drafters (patch models: load a split MTP drafter folder as the model's MTP head). Stock vs patched.

The published Qwen MTP drafters (mlx-vlm's ``qwen3_5_mtp`` splitter, mlx-community ``*-MTP-*`` repos) are folders of
their own: ``config.json`` with ``model_type`` ``"<family>_mtp"``, ``model.safetensors`` with only the head. The
probe (probes/mtp_split.py) builds such folders locally, from the tiny ``qwen3_5-random`` of ``overlay.check.models``
(a Hugging Face checkpoint with an ``mtp.*`` head: split as the splitter does, norms shifted) and from folders
converted with ``--keep-mtp`` (the sidecar, fp32 and 4-bit). The target is a stock conversion without MTP weights
(what mlx-community publishes next to the drafters).

- Loaded with ``model_config={"mtp_path": DRAFTER}``, the patched arm attaches the head; its MTP logits are bit for
  bit those of the same head loaded from the checkpoint itself (``keep_mtp``), for the Hugging Face split, the
  fp32 sidecar split and the 4-bit split (next to a 4-bit target, and quantized on its own next to an fp32 one).
  The main model's logits do not change. Stock ignores the key: no head.
- A folder that is not a split drafter, or a drafter of another family, is refused with a message that says so.
- ``mlx_lm.generate --draft-kind mtp --draft-model DRAFTER`` (qwen3_next, word-level tokenizer) prints the text of
  stock ``mlx_lm.generate`` without a drafter; ``mlx_lm.server`` with the same flags answers it too, drafting with
  the head (``usage.speculative``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from test_mtp_loading import TOKENS, build_families
from test_spec_stats import BUILD

from overlay.check import models as tinymodels
from overlay.check.envs import Arms

PROBES = Path(__file__).parent / "probes"
SPLIT = PROBES / "mtp_split.py"
SIDECAR = PROBES / "mtp_sidecar.py"
SERVER = PROBES / "spec_server.py"
Q4 = {"bits": 4, "group_size": 32}
PROMPT_TEXT = "<5> <9> <13> <17> <21> <25> <29> <33>"
CLI_TOKENS = 24


@pytest.fixture(scope="module")
def built(arms: Arms, repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    src = str(tinymodels.build("qwen3_5-random", root=repo_root, python=arms.stock.python))
    out = tmp_path_factory.mktemp("mtp-split")
    d = {name: str(out / name) for name in ("kept", "kept-q4", "plain", "plain-q4", "hf", "mlx", "mlx-q4")}
    arms.patched.run_json(
        SIDECAR,
        {
            "mode": "convert",
            "jobs": [
                {"src": src, "dst": d["kept"], "keep": True, "quantize": None},
                {"src": src, "dst": d["kept-q4"], "keep": True, "quantize": Q4},
            ],
        },
    )
    arms.stock.run_json(
        SIDECAR,
        {
            "mode": "convert",
            "jobs": [
                {"src": src, "dst": d["plain"], "keep": False, "quantize": None},
                {"src": src, "dst": d["plain-q4"], "keep": False, "quantize": Q4},
            ],
        },
    )
    split = arms.stock.run_json(
        SPLIT,
        {
            "mode": "split",
            "jobs": [
                {"src": src, "dst": d["hf"], "source": "hf"},
                {"src": d["kept"], "dst": d["mlx"], "source": "mlx"},
                {"src": d["kept-q4"], "dst": d["mlx-q4"], "source": "mlx"},
            ],
        },
    )
    return {"src": src, "dirs": d, "split": split}


def _load(arm: Any, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = arm.run_json(SPLIT, {"mode": "load", "jobs": jobs, "tokens": TOKENS})
    return result


def test_split_drafter_loads_as_the_mtp_head(arms: Arms, built: dict[str, Any]) -> None:
    d = built["dirs"]
    assert {v["model_type"] for v in built["split"].values()} == {"qwen3_5_mtp"}
    assert "fc.weight" in built["split"][d["hf"]]["tensors"]
    assert not [t for t in built["split"][d["hf"]]["tensors"] if t.startswith("mtp.")]
    jobs = [
        {"model": built["src"], "config": {"keep_mtp": True}},  # 0: the head from the HF checkpoint itself
        {"model": d["kept-q4"], "config": {"keep_mtp": True}},  # 1: the 4-bit head from its sidecar
        {"model": d["plain"], "config": None},  # 2: the target alone
        {"model": d["plain"], "config": {"mtp_path": d["hf"]}},  # 3
        {"model": d["plain"], "config": {"mtp_path": d["mlx"]}},  # 4
        {"model": d["plain-q4"], "config": {"mtp_path": d["mlx-q4"]}},  # 5
        {"model": d["plain"], "config": {"mtp_path": d["mlx-q4"]}},  # 6: a quantized head, an fp32 target
        {"model": d["kept"], "config": {"mtp_path": d["hf"]}},  # 7: the drafter replaces the sidecar's head
    ]
    patched = _load(arms.patched, jobs)
    errors = [(i, r["error"]) for i, r in enumerate(patched) if "error" in r]
    assert not errors, errors
    ref, ref_q4, plain = patched[0], patched[1], patched[2]
    assert ref["has_mtp"] and ref_q4["has_mtp"] and not plain["has_mtp"]
    for i in (3, 4, 7):
        assert patched[i]["has_mtp"], i
        assert patched[i]["mtp_logits"] == ref["mtp_logits"], (
            f"job {i}: the split head differs from the original"
        )
        assert patched[i]["logits"] == plain["logits"] == ref["logits"]
    assert patched[5]["has_mtp"] and patched[5]["mtp_logits"] == ref_q4["mtp_logits"]
    assert patched[5]["quantized"] == ref_q4["quantized"] > 0
    assert patched[6]["has_mtp"] and patched[6]["quantized"] == ref_q4["quantized"]
    assert patched[6]["logits"] == plain["logits"], "the fp32 target stays unquantized"

    stock = _load(arms.stock, [{"model": d["plain"], "config": {"mtp_path": d["hf"]}}])
    assert stock[0]["logits"] == plain["logits"] and not stock[0]["has_mtp"]


def test_not_a_drafter_is_refused(arms: Arms, built: dict[str, Any], repo_root: Path) -> None:
    d = built["dirs"]
    llama = str(tinymodels.build("llama-random", root=repo_root, python=arms.stock.python))
    refused = _load(
        arms.patched,
        [
            {"model": d["plain"], "config": {"mtp_path": d["plain"]}},
            {"model": llama, "config": {"mtp_path": d["hf"]}},
        ],
    )
    assert "not a split MTP drafter" in refused[0]["error"] and "model_type" in refused[0]["error"]
    assert "qwen3_5_mtp" in refused[1]["error"] and "llama" in refused[1]["error"]


def _cli_text(arm: Any, model: str, *extra: str) -> str:
    proc = arm.run(
        [
            "-m",
            "mlx_lm",
            "generate",
            "--model",
            model,
            "--prompt",
            PROMPT_TEXT,
            "--max-tokens",
            str(CLI_TOKENS),
            "--temp",
            "0",
            "--ignore-chat-template",
            *extra,
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    parts: list[str] = proc.stdout.split("==========")
    assert len(parts) >= 3, proc.stdout
    return parts[1].strip()


def test_generate_cli_with_a_split_drafter(
    arms: Arms, repo_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    families = build_families(arms, repo_root)
    spec = arms.stock.run_json(BUILD, {"out": str(repo_root / "build" / "models")})["models"]
    out = tmp_path_factory.mktemp("mtp-split-cli")
    src = out / "src"
    src.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(families["qwen3_next"]["dir"]) / name, src / name)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(spec["qwen3"]) / name, src / name)
    kept, plain, drafter = out / "kept", out / "plain", out / "drafter"
    arms.patched.run_json(
        SIDECAR,
        {"mode": "convert", "jobs": [{"src": str(src), "dst": str(kept), "keep": True, "quantize": None}]},
    )
    arms.stock.run_json(
        SIDECAR,
        {"mode": "convert", "jobs": [{"src": str(src), "dst": str(plain), "keep": False, "quantize": None}]},
    )
    split = arms.stock.run_json(
        SPLIT, {"mode": "split", "jobs": [{"src": str(kept), "dst": str(drafter), "source": "mlx"}]}
    )
    assert split[str(drafter)]["model_type"] == "qwen3_next_mtp"

    serial = _cli_text(arms.stock, str(plain))
    assert len(serial.split()) == CLI_TOKENS
    assert (
        _cli_text(
            arms.patched,
            str(plain),
            "--draft-kind",
            "mtp",
            "--draft-model",
            str(drafter),
            "--num-draft-tokens",
            "2",
        )
        == serial
    )

    body = {"prompt": PROMPT_TEXT, "max_tokens": CLI_TOKENS, "temperature": 0}
    result = arms.patched.run_json(
        SERVER,
        {
            "args": [
                "--model",
                str(plain),
                "--draft-kind",
                "mtp",
                "--draft-model",
                str(drafter),
                "--num-draft-tokens",
                "2",
            ],
            "requests": [body],
        },
        timeout=900,
    )
    reply = result["responses"][0]
    assert reply["status"] == 200, result
    assert reply["body"]["choices"][0]["text"].strip() == serial
    assert reply["body"]["usage"]["speculative"]["draft_kind"] == "mtp"
