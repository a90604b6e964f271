"""`overlay apply vllm` builds both patched wheels, each keeping its own distribution name (long: 460 MB written)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from overlay.core.manifest import load_engine
from overlay.core.wheels import WheelName
from support import Cli

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.long


def test_apply_builds_both_wheels_under_their_own_names(tmp_path: Path, cli: Cli) -> None:
    manifest = load_engine(REPO, "vllm")
    res = cli("--root", str(REPO), "-q", "apply", "vllm", "--out", str(tmp_path))
    assert res.code == 0, res.err
    wheels = [Path(line) for line in res.out.split()]
    names = {WheelName.parse(w.name).distribution.replace("_", "-"): w for w in wheels}
    assert sorted(names) == ["vllm", "vllm-cpu"]
    assert wheels[-1] == names["vllm-cpu"]  # the primary artifact is built last, its path printed last
    for dist, wheel in names.items():
        artifact = next(a for a in manifest.upstream.artifacts if manifest.distribution_of(a) == dist)
        with zipfile.ZipFile(wheel) as zf:
            dist_info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            meta = zf.read(f"{dist_info}/METADATA").decode()
            prov = json.loads(zf.read(f"{dist_info}/overlay.json"))
            tags = [
                line
                for line in zf.read(f"{dist_info}/WHEEL").decode().splitlines()
                if line.startswith("Tag:")
            ]
        assert f"Name: {dist}\n" in meta
        assert prov["upstream"]["distribution"] == dist
        assert prov["upstream"]["artifact"] == {"filename": artifact.filename, "sha256": artifact.sha256}
        assert (
            tags
        )  # upstream's WHEEL kept (its tags differ from the file name's: allow-members "wheel-tags")
