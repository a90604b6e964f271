"""vLLM in the device run (scripts/device/vllm_*.py, docs/benchmarks.md "Device run"): its plan and budget share, the
import closure that decides what travels, the native stand-ins, the carry's integrity checks, the per-case verdict
(neutral on CUDA or not) and, long, the dry run through ``device_check.sh run --dry-run --engine vllm`` (the real CUDA
wheel's trees in the vLLM CPU arm's Python).

The fast tests need no torch and no engine; the dry run fetches the pinned CUDA wheel once (326.5 MB, network) and
runs four vLLM processes on the CPU (~1 minute on the 2-core VM, plus ~1 minute of prepare the first time).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEVICE = REPO / "scripts" / "device"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(DEVICE))
    spec = importlib.util.spec_from_file_location(name, DEVICE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


plan = _load("plan")
vllm_native = _load("vllm_native")
vllm_prepare = _load("vllm_prepare")
vllm_check = _load("vllm_check")
vllm_records = _load("vllm_records")
vllm_probes_source = (DEVICE / "vllm_probes.py").read_text()


def test_vllm_takes_the_gpu_while_the_exllamav3_builds_run() -> None:
    with_vllm = plan.split_budget(plan.DEFAULT_BUDGET_S)
    without = plan.split_budget(plan.DEFAULT_BUDGET_S, vllm=False)
    assert with_vllm["vllm"] == plan.VLLM_S and without["vllm"] == 0
    # SGLang's and ExLlamaV3's shares are what they were: vLLM fits in the GPU's idle time beside the builds
    assert {k: v for k, v in with_vllm.items() if k != "vllm"} == {
        k: v for k, v in without.items() if k != "vllm"
    }
    assert plan.vllm_fits_beside_the_builds()
    assert (
        with_vllm["setup"] + with_vllm["sglang"] + with_vllm["vllm"]
        <= with_vllm["setup"] + with_vllm["exllamav3_build"]
    )
    # a budget too small for all of them gives ExLlamaV3's probes what is left after SGLang and vLLM
    tight = plan.split_budget(300)
    assert tight["exllamav3"] == max(
        0, 300 - 50 - max(tight["sglang"] + tight["vllm"], tight["exllamav3_build"])
    )


def test_every_vllm_patch_has_a_gate_or_a_probe() -> None:
    resolved = vllm_records.resolve(REPO)
    assert resolved["unplanned"] == []
    assert resolved["entries"], "no declared mechanism resolved from patches/vllm"
    names = [p["patch"] for p in resolved["patches"]]
    for probe in plan.VLLM_PROBES:  # a renamed patch must not orphan its probe
        for prefix in probe.patches:
            assert any(plan.slug(n).startswith(prefix) for n in names), (probe.key, prefix)
        if probe.pending:
            assert len(probe.pending) > 60, probe.key
        elif probe.key in ("sampler", "penalties", "rejection"):
            assert f'"{probe.key}",' in vllm_probes_source, f"vllm_probes.py has no case for {probe.key}"
    for gate in plan.VLLM_CPU_PATH_ONLY:
        assert any(plan.slug(n).startswith(gate.patch) for n in names), gate.patch
    # the device sets every switch of the series
    assert all(k.startswith("VLLM_") and v for k, v in resolved["flags"].items())
    assert any(k.startswith("VLLM_OVL_") for k in resolved["flags"])


def test_records_never_claim_a_cpu_mechanism_on_the_gpu() -> None:
    resolved = vllm_records.resolve(REPO)
    report = {
        "dry_run": False,
        "measurements": [
            {"key": "sampler", "neutral": True},
            {"key": "penalties", "neutral": False},
            {"key": "rejection", "neutral": None, "reason": "not measured: no case ran in both arms"},
        ],
    }
    recs = vllm_records.records(resolved, report)
    assert len(recs) == len(resolved["entries"])
    assert all(r["holds"] is None and r["note"].startswith("not measured on the GPU") for r in recs)
    by_patch = {r["patch"][5:40]: r for r in recs}
    sampler = next(r for p, r in by_patch.items() if p.startswith("sample-top-p-over"))
    penalties = next(r for p, r in by_patch.items() if p.startswith("sample-penalties"))
    assert sampler["neutral"] is True and "CUDA unchanged" in sampler["note"]
    assert penalties["neutral"] is False and "CUDA CHANGED" in penalties["note"]
    assert vllm_records.neutral_failures(report, dry_run=False) == ["penalties"]
    assert vllm_records.neutral_failures(report, dry_run=True) == []


def test_closure_follows_what_the_modules_import(tmp_path: Path) -> None:
    pkg = tmp_path / "vllm"
    for rel, text in {
        "__init__.py": "",
        "a.py": "import vllm.b\nfrom . import c\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import vllm.typing_only\ntry:\n    from vllm.d import thing\nexcept ImportError:\n"
        "    pass\ndef f():\n    import vllm.lazy\n",
        "b.py": "import os\n",
        "c.py": "from .sub import e\n",
        "d.py": "thing = 1\n",
        "sub/__init__.py": "",
        "sub/e.py": "from ..b import x\n",
        "typing_only.py": "",
        "lazy.py": "",
        "unused.py": "",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    shallow = vllm_prepare.closure(tmp_path, ["vllm.a"])
    assert shallow == [
        "vllm/__init__.py",
        "vllm/a.py",
        "vllm/b.py",
        "vllm/c.py",
        "vllm/d.py",
        "vllm/sub/__init__.py",
        "vllm/sub/e.py",
    ]
    # a probed module's functions' imports are followed too (what its calls import when they run)
    assert "vllm/lazy.py" in vllm_prepare.closure(tmp_path, ["vllm.a"], deep=["vllm.a"])


def test_native_modules_are_labelled_stand_ins_that_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert vllm_native.module_name("vllm/_C_stable_libtorch.abi3.so") == "vllm._C_stable_libtorch"
    assert (
        vllm_native.module_name("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")
        == "vllm.vllm_flash_attn._vllm_fa2_C"
    )
    assert vllm_native.module_name("vllm/envs.py") is None
    (tmp_path / "ovlfake").mkdir()
    (tmp_path / "ovlfake" / "__init__.py").write_text("")
    (tmp_path / "ovlfake" / "_real.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    vllm_native.install(["ovlfake._C", "ovlfake._real"])
    try:
        stand_in = importlib.import_module("ovlfake._C")
        assert isinstance(stand_in, vllm_native.StandIn)
        with pytest.raises(vllm_native.NativeStandIn, match=r"ovlfake\._C\.op: .*stand-in"):
            _ = stand_in.op
        # a module that exists is never stood in (the finder is the last one asked)
        assert importlib.import_module("ovlfake._real").VALUE == 7
        assert "ovlfake._C" in vllm_native.stood_in() and "ovlfake._real" not in vllm_native.stood_in()
    finally:
        for name in [n for n in sys.modules if n.startswith("ovlfake")]:
            del sys.modules[name]


def _carry(tmp_path: Path) -> Path:
    carry = tmp_path / "carry"
    carry.mkdir()
    stock = {
        "vllm/__init__.py": b"",
        "vllm/x.py": b"def f():\n    return 1\n",
        "vllm/y.py": b"Y = 1\n",
        "vllm-1.dist-info/METADATA": b"Name: vllm\nVersion: 1\n",
    }
    patched = {
        "vllm/x.py": b"def f():\n    return 1\n\n\ndef ovl_g():\n    return 2\n",
        "vllm-1+ovl.dist-info/METADATA": b"Name: vllm\nVersion: 1+ovl\n",
    }
    vllm_prepare._tar_xz(carry / "stock.tar.xz", stock)
    vllm_prepare._tar_xz(carry / "patched.tar.xz", patched)
    vllm_prepare._tar_xz(carry / "deps-cp312.tar.xz", {"dep/__init__.py": b""})
    tree = {**stock, **patched}
    manifest = {
        "version": vllm_prepare.MANIFEST_VERSION,
        "native_modules": [],
        "probed": ["vllm.x"],
        "files": {
            "stock": {f: vllm_prepare._sha256(b) for f, b in stock.items()},
            "patched": {
                f: vllm_prepare._sha256(b)
                for f, b in tree.items()
                if f not in ("vllm/y.py", "vllm-1.dist-info/METADATA")
            },
        },
        "archives": {
            p.name: {"bytes": p.stat().st_size, "sha256": vllm_prepare._sha256(p.read_bytes())}
            for p in carry.glob("*.tar.xz")
        },
    }
    (carry / "manifest.json").write_text(json.dumps(manifest))
    return carry


def test_the_device_rebuilds_and_checks_both_trees(tmp_path: Path) -> None:
    carry = _carry(tmp_path)
    trees, manifest, site = vllm_check.unpack(carry, tmp_path / "work", deps=True)
    assert (trees["patched"] / "vllm" / "x.py").read_text().endswith("return 2\n")
    assert (trees["stock"] / "vllm" / "y.py").is_file() and not (trees["patched"] / "vllm" / "y.py").exists()
    # one .dist-info per tree, so importlib.metadata.version("vllm") reads the tree's own (vLLM's platform detection)
    assert sorted(p.name for p in trees["patched"].glob("*.dist-info")) == ["vllm-1+ovl.dist-info"]
    assert site is not None and (site / "dep" / "__init__.py").is_file()
    assert vllm_check.added_functions(trees["stock"], trees["patched"], ["vllm.x", "vllm.y"]) == {
        "vllm.x": ["ovl_g"]
    }
    # a carried file that is not the prepared one is refused, naming it
    manifest["files"]["stock"]["vllm/y.py"] = "0" * 64
    (carry / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(vllm_check.CarryError, match=r"stock tree's vllm/y.py does not match"):
        vllm_check.unpack(carry, tmp_path / "work2", deps=False)
    with pytest.raises(vllm_check.CarryError, match="prepare"):
        vllm_check.unpack(tmp_path / "nothing", tmp_path / "work3", deps=False)


def test_a_stale_or_missing_carry_says_what_to_run(tmp_path: Path) -> None:
    assert "not prepared" in str(vllm_prepare.stale(REPO / "build" / "no-such-carry"))
    carry = _carry(tmp_path)
    doc = json.loads((carry / "manifest.json").read_text())
    doc["series_digest"] = "an older series"
    (carry / "manifest.json").write_text(json.dumps(doc))
    assert str(vllm_prepare.stale(carry)).startswith("stale: patches/vllm changed")
    doc["series_digest"] = vllm_prepare.series_digest()
    (carry / "manifest.json").write_text(json.dumps(doc))
    assert vllm_prepare.stale(carry) is None


def _row(**kw: Any) -> dict[str, Any]:
    census = dict.fromkeys(vllm_check.COMPARED, 0.0) | {"eager-launches": 12.0}
    return (
        {"key": "sampler", "error": None, "native": False, "entered": {}, "deterministic": True}
        | {"census": census}
        | kw
    )


def test_a_case_is_neutral_only_when_everything_matches() -> None:
    same = {"stock_vs_flag_off": True, "stock_vs_patched": True}
    rows: dict[str, dict[str, Any] | None] = {c: _row() for c in vllm_check.CONFIGS}
    assert vllm_check.compare_case(rows, same)["neutral"] is True
    assert vllm_check.compare_case(rows, {**same, "stock_vs_patched": False})["neutral"] is False
    entered = {**rows, "patched": _row(entered={"mod:ovl_fn": 2})}
    verdict = vllm_check.compare_case(entered, same)
    assert verdict["neutral"] is False and "mod:ovl_fn x2" in verdict["why"]
    counted = {**rows, "patched": _row(census=dict.fromkeys(vllm_check.COMPARED, 0.0) | {"host-syncs": 1.0})}
    assert "census differs: host-syncs 0.0 / 0.0 / 1.0" in vllm_check.compare_case(counted, same)["why"]
    native = "AttributeError: '_OpNamespace' '_C' object has no attribute 'apply_repetition_penalties_'"
    both_failed = {c: _row(error=native, native=True) for c in vllm_check.CONFIGS}
    verdict = vllm_check.compare_case(both_failed, same)
    assert verdict["neutral"] is None and verdict["why"].startswith("not measured: needs a native module")
    one_failed = {**rows, "patched": _row(error="RuntimeError: boom")}
    assert vllm_check.compare_case(one_failed, same)["neutral"] is False
    assert vllm_check.compare_case({**rows, "stock": None}, same)["neutral"] is None


def test_the_0008_go_no_go() -> None:
    probes = _load("vllm_probes")
    assert probes.go_no_go({"ci": [1.2, 1.4]}, {"ci": [1.5, 1.9]}) == "go"
    assert probes.go_no_go({"ci": [0.3, 0.4]}, {"ci": [0.6, 0.8]}) == "no-go"
    assert probes.go_no_go({"ci": [0.8, 0.9]}, {"ci": [0.9, 1.3]}) == "inconclusive"


def test_the_carried_dependencies_are_the_pinned_versions() -> None:
    manifest = tomllib.loads((REPO / "overlays" / "vllm.toml").read_text())
    pins = {}
    for req in manifest["runtime"]["requirements"]:
        name, _, version = req.partition("==")
        pins[name.split("[")[0].lower().replace("_", "-")] = version
    checked = 0
    for dep in vllm_prepare.VLLM_DEPS:
        name, _, version = dep.partition("==")
        if name in pins:
            assert pins[name] == version, dep
            checked += 1
    assert checked >= 6


@pytest.mark.network
@pytest.mark.long
def test_vllm_dry_run(tmp_path: Path) -> None:
    """The dry run: the CUDA wheel's trees (stock and the series) in the vLLM CPU arm's Python, CPU tensors, the CPU
    census. There the series' CPU branches are taken, so the check must see them: that is what it looks for on CUDA."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "device_check.sh"), "run", "--dry-run", "--engine", "vllm"],
        cwd=REPO,
        env={**os.environ, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "vllm 150 s" in proc.stderr  # the budget line names vLLM's share
    report = json.loads((tmp_path / "device-check.json").read_text())
    assert report["verdict"] == "pass" and report["dry_run"]
    result = report["engines"]["vllm"]
    assert result["exit_code"] == 0, result["log"]
    recs = result["records"]
    assert recs and all(r["holds"] is None for r in recs)
    raw = json.loads((tmp_path / "vllm-device.json").read_text())
    assert raw["engine"] == "vllm" and raw["dry_run"]
    # what travels: the real wheel's files, small enough to carry beside SGLang's and ExLlamaV3's
    assert raw["carry"]["wheels"]["stock"]["name"] == vllm_prepare.CUDA_WHEEL
    assert sum(a["bytes"] for a in raw["carry"]["archives"].values()) < 9_000_000
    versions = {c: raw["configs"][c]["info"]["vllm_version"] for c in ("stock", "flag_off", "patched")}
    assert versions["stock"] == "0.32.0" and versions["patched"].startswith("0.32.0+ovl"), versions
    # every native module of the wheel is named for a stand-in (the CPU platform imports none of them)
    assert "vllm._C_stable_libtorch" in raw["carry"]["native_modules"]
    # the series' added functions are found and watched
    topk = raw["watched"]["vllm.v1.sample.ops.topk_topp_sampler"]
    assert "apply_top_k_top_p_preselected" in topk and "apply_top_p_nucleus" in topk
    by_key = {m["key"]: m for m in raw["measurements"]}
    cases = by_key["sampler"]["cases"]
    # the CPU path (allow_cpu_sync) enters 0006's function with its flag and not without: the check sees it
    kp = cases["apply_top_k_top_p:k+p"]
    assert kp["patched"]["entered"].get("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p_preselected")
    assert not kp["flag_off"]["entered"] and kp["neutral"] is False
    # the PyTorch path as CUDA calls it without Triton (allow_cpu_sync False) is stock's, bit for bit
    assert cases["apply_top_k_top_p_pytorch:k+p"]["neutral"] is True
    pen = by_key["penalties"]["cases"]["apply_all_penalties:view"]
    assert pen["patched"]["entered"] and pen["neutral"] is False
    # 0002 keeps the OpenAI protocol stack out of what these modules import
    imports = by_key["imports"]["by_config"]
    assert imports["stock"]["markers"]["openai"] and not imports["patched"]["markers"]["openai"]
    assert imports["patched"]["vllm_modules"] < imports["stock"]["vllm_modules"]
    assert (
        by_key["generator-rewind"]["status"] == "skipped"
        and "pending" in by_key["generator-rewind"]["reason"]
    )
    timing = raw["timing"]["by_rows"]
    assert timing and all(
        t["equal_outputs"] and t["verdict"] in ("go", "no-go", "inconclusive") for t in timing.values()
    )
