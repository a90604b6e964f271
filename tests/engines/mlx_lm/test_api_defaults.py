"""Loading and API defaults the series must keep or extend: stock vs patched.

- Hub downloads (patch convert: write kept MTP weights to an mtp.safetensors sidecar): a converted model published on
  the Hub keeps its MTP head in ``mtp.safetensors``, so ``mlx_lm.utils.DEFAULT_ALLOW_PATTERNS`` must request it.
  probes/hub_allow.py builds a local Hub cache (refs, a snapshot, the commit's tree listing) and calls
  ``_download(repo_id)`` with ``HF_HUB_OFFLINE=1``: huggingface_hub's snapshot code filters the listing by the
  patterns and raises when a requested file is missing from the snapshot. Patched requests the sidecar (a snapshot
  without it is incomplete; with it, the folder is returned), stock does not.
- ``speculative_generate_step``'s ``prefill_step_size`` default stays stock's 512 (patch generate: exact speculative
  decoding with sliding-window targets once changed it to 2048 silently: peak prefill memory for API callers).
"""

from __future__ import annotations

from pathlib import Path

from overlay.check.envs import Arms

PROBES = Path(__file__).parent / "probes"
FILES = {
    "config.json": "{}",
    "model.safetensors": "weights",
    "mtp.safetensors": "head",
    "tokenizer.json": "{}",
    "tokenizer_config.json": "{}",
}


def test_hub_download_requests_the_mtp_sidecar(arms: Arms, tmp_path: Path) -> None:
    res = {}
    for arm in (arms.stock, arms.patched):
        for omit in ((), ("mtp.safetensors",)):
            cache = tmp_path / f"{arm.name}-{len(omit)}"
            res[arm.name, bool(omit)] = arm.run_json(
                PROBES / "hub_allow.py", {"cache": str(cache), "files": FILES, "omit": list(omit)}
            )
    assert "mtp.safetensors" not in res["stock", False]["allowed"]  # the defect, inherited from stock
    assert "mtp.safetensors" in res["patched", False]["allowed"]
    assert "model.safetensors" in res["patched", False]["allowed"]
    full = res["patched", False]
    assert (
        full["error"] is None and full["download"] and (Path(full["download"]) / "mtp.safetensors").is_file()
    )
    missing = res["patched", True]
    assert missing["download"] is None and missing["error"] is not None
    assert "IncompleteSnapshotError" in missing["error"] and "mtp.safetensors" in missing["error"]
    # Stock never asks for it: a snapshot without the head looks complete.
    assert res["stock", True]["error"] is None


def test_speculative_prefill_default_is_stock(arms: Arms) -> None:
    stock = arms.stock.run_json(PROBES / "api_defaults.py", {})
    patched = arms.patched.run_json(PROBES / "api_defaults.py", {})
    assert stock["speculative_prefill_step_size"] == 512
    assert patched == stock
