from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import Cli, World

GOLDEN = Path(__file__).parent / "golden" / "demo-wheel.txt"


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def test_apply_builds_a_patched_drop_in_wheel(world2: World, cli: Cli) -> None:
    r = cli("--root", str(world2.root), "apply", "demo")
    assert r.code == 0, r.err
    wheel = Path(r.out.strip().splitlines()[-1])
    assert wheel.parent == world2.root / "build" / "wheels" / "demo"
    series_sha = hashlib.sha256(
        b"".join(p.read_bytes() for p in sorted(world2.series_dir.glob("*.patch")))
    ).hexdigest()
    version = f"1.2.0+ovl.20260102030405.2.g{series_sha[:8]}"  # ORDER: the patches' Date (GIT_ENV)
    assert wheel.name == f"demo_engine-{version}-py3-none-any.whl"
    files = members(wheel)
    assert b'prefix = "hi"' in files["demo_pkg/core.py"]
    assert b'__version__ = "1.2.0"' in files["demo_pkg/core.py"]  # the module's own version is untouched
    stock = members(world2.wheel)
    assert files["demo_pkg/native.so"] == stock["demo_pkg/native.so"]  # compiled files carried unchanged
    prov = json.loads(files[f"demo_engine-{version}.dist-info/overlay.json"])
    assert prov["version"] == 1 and prov["engine"] == "demo"
    assert prov["upstream"]["artifact"]["sha256"] == hashlib.sha256(world2.wheel.read_bytes()).hexdigest()
    assert prov["series"]["sha256"] == series_sha
    assert [p["subject"] for p in prov["series"]["patches"]] == [
        "core: shorter greeting",
        "util: double by addition",
    ]
    for line in ["unpack: reading", "apply: [1/2]", "apply: [2/2]", "wheel: writing"]:
        assert line in r.err
    listing = "".join(f"{n} {hashlib.sha256(d).hexdigest()[:16]}\n" for n, d in files.items())
    if os.environ.get("OVERLAY_UPDATE_GOLDEN"):
        GOLDEN.write_text(listing)
    assert listing == GOLDEN.read_text(), (
        "wheel contents changed; OVERLAY_UPDATE_GOLDEN=1 rewrites the golden file"
    )


def test_bytes_are_reproducible_and_upto_applies_a_prefix(world2: World, cli: Cli, tmp_path: Path) -> None:
    a = cli("--root", str(world2.root), "-q", "apply", "demo", "--out", str(tmp_path / "a"))
    b = cli("--root", str(world2.root), "-q", "apply", "demo", "--out", str(tmp_path / "b"))
    wa, wb = Path(a.out.strip()), Path(b.out.strip())
    assert wa.read_bytes() == wb.read_bytes()
    one = cli("--root", str(world2.root), "-q", "apply", "demo", "--upto", "1", "--json")
    data = json.loads(one.out)
    assert data["patches"] == [sorted(p.name for p in world2.series_dir.glob("*.patch"))[0]]
    assert ".1.g" in data["wheel_version"]
    files = members(Path(data["wheel"]))
    assert b'prefix = "hi"' in files["demo_pkg/core.py"] and b"2 * x" in files["demo_pkg/util.py"]
    bad = cli("--root", str(world2.root), "apply", "demo", "--upto", "3")
    assert bad.code == 2 and "--upto 3 is out of range" in bad.err


def test_failed_apply_publishes_nothing(world2: World, cli: Cli) -> None:
    patch = sorted(world2.series_dir.glob("0002-*.patch"))[0]
    patch.write_bytes(patch.read_bytes().replace(b"-    return 2 * x", b"-    return 3 * x"))
    r = cli("--root", str(world2.root), "apply", "demo")
    assert r.code == 3
    assert f"patch {patch.name} does not apply: python/demo_pkg/util.py, hunk #1" in r.err
    assert "TIP refresh the patch" in r.err
    out = world2.root / "build" / "wheels" / "demo"
    assert not out.exists() or not list(out.iterdir())
    assert not list((world2.root / "build" / "tmp").iterdir())


def test_killed_build_leaves_scratch_that_next_run_cleans(world2: World, cli: Cli) -> None:
    tmp = world2.root / "build" / "tmp"
    stale = tmp / "apply-demo-killed"
    (stale / "out").mkdir(parents=True)
    (stale / "out" / "half.whl").write_bytes(b"PK\x03\x04 half")
    dead = subprocess.Popen(["true"])
    dead.wait()
    (stale / ".owner").write_text(str(dead.pid))
    r = cli("--root", str(world2.root), "-q", "apply", "demo")
    assert r.code == 0
    assert not stale.exists()
    assert [p.name for p in (world2.root / "build" / "wheels" / "demo").iterdir()] == [
        Path(r.out.strip()).name
    ]


def test_hash_mismatch_exits_5_and_caches_nothing(world2: World, cli: Cli) -> None:
    world2.write_manifest(sha256="0" * 64)
    r = cli("--root", str(world2.root), "fetch", "demo")
    assert r.code == 5
    assert "sha256 mismatch for demo_engine-1.2.0-py3-none-any.whl: expected " + "0" * 64 in r.err
    cache = world2.root / "build" / "cache" / "artifacts"
    assert not [p for p in cache.rglob("*") if p.is_file()]


def test_truncated_artifact_exits_5(world2: World, cli: Cli) -> None:
    data = world2.wheel.read_bytes()
    world2.wheel.write_bytes(data[:-200])
    world2.write_manifest()  # pin the truncated file's hash: integrity of the archive itself is what fails
    r = cli("--root", str(world2.root), "apply", "demo")
    assert r.code == 5 and "corrupt or truncated" in r.err


def test_warm_cache_works_offline(world2: World, cli: Cli) -> None:
    assert cli("--root", str(world2.root), "-q", "fetch", "demo").code == 0
    world2.wheel.unlink()  # the "index" is gone
    r = cli("--root", str(world2.root), "-q", "apply", "demo", "--offline")
    assert r.code == 0, r.err
    for p in (world2.root / "build" / "cache" / "artifacts").rglob("*.whl"):
        p.unlink()
    r = cli("--root", str(world2.root), "apply", "demo", "--offline")
    assert r.code == 2 and "not in the cache" in r.err and "overlay fetch demo" in r.err


@pytest.mark.slow
def test_git_source_gives_the_same_package_files(world2: World, cli: Cli, tmp_path: Path) -> None:
    art = cli("--root", str(world2.root), "-q", "apply", "demo", "--out", str(tmp_path / "a"))
    git = cli(
        "--root", str(world2.root), "-q", "apply", "demo", "--source", "git", "--out", str(tmp_path / "g")
    )
    assert art.code == 0 and git.code == 0, git.err
    a, g = members(Path(art.out.strip())), members(Path(git.out.strip()))
    assert Path(art.out.strip()).name == Path(git.out.strip()).name
    pkg = sorted(n for n in a if n.startswith("demo_pkg/"))
    assert pkg == sorted(n for n in g if n.startswith("demo_pkg/"))
    assert all(a[n] == g[n] for n in pkg)
    prov = json.loads(next(v for k, v in g.items() if k.endswith("overlay.json")))
    assert prov["source"]["kind"] == "git" and prov["source"]["commit"] == world2.base_commit
    assert prov["series"] == json.loads(next(v for k, v in a.items() if k.endswith("overlay.json")))["series"]


def test_artifact_selection(world2: World, cli: Cli, tmp_path: Path) -> None:
    r = cli(
        "--root",
        str(world2.root),
        "apply",
        "demo",
        "--artifact",
        "demo_engine-1.2.0-cp312-cp312-linux_x86_64.whl",
    )
    assert r.code == 2 and "is not pinned" in r.err and "demo_engine-1.2.0-py3-none-any.whl" in r.err
    ok = cli(
        "--root",
        str(world2.root),
        "-q",
        "apply",
        "demo",
        "--artifact",
        world2.wheel.name,
        "--out",
        str(tmp_path),
    )
    assert ok.code == 0 and Path(ok.out.strip()).parent == tmp_path


def _sdist(world: World, tmp_path: Path) -> Path:
    """The release sdist: built from the base commit (the upstream repo's `work` branch holds our patches)."""
    base = tmp_path / "base"
    subprocess.run(
        ["git", "worktree", "add", "-q", "--detach", str(base), world.base_commit],
        cwd=world.upstream,
        check=True,
        capture_output=True,
    )
    out = tmp_path / "sdist"
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(base / "python")],
        check=True,
        capture_output=True,
    )
    return next(out.glob("*.tar.gz"))


@pytest.mark.slow
def test_sdist_pin_builds_with_the_projects_backend(world2: World, cli: Cli, tmp_path: Path) -> None:
    sdist = _sdist(world2, tmp_path)
    wheel_build = cli("--root", str(world2.root), "-q", "apply", "demo", "--out", str(tmp_path / "w"))
    world2.write_manifest(
        filename=sdist.name, sha256=hashlib.sha256(sdist.read_bytes()).hexdigest(), url=sdist.as_uri()
    )
    r = cli("--root", str(world2.root), "-q", "apply", "demo", "--out", str(tmp_path / "s"))
    assert r.code == 0, r.err
    a, s = members(Path(wheel_build.out.strip())), members(Path(r.out.strip()))
    pkg = sorted(n for n in a if n.startswith("demo_pkg/"))
    assert pkg == sorted(n for n in s if n.startswith("demo_pkg/")) and all(a[n] == s[n] for n in pkg)
    prov = json.loads(next(v for k, v in s.items() if k.endswith("overlay.json")))
    assert prov["upstream"]["artifact"]["filename"] == sdist.name


def test_sdist_with_escaping_member_is_refused(world2: World, cli: Cli, tmp_path: Path) -> None:
    import io
    import tarfile

    bad = tmp_path / "demo-engine-1.2.0.tar.gz"
    with tarfile.open(bad, "w:gz") as tf:
        data = b"x = 1\n"
        info = tarfile.TarInfo("demo-engine-1.2.0/../../escape.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    world2.write_manifest(
        filename=bad.name, sha256=hashlib.sha256(bad.read_bytes()).hexdigest(), url=bad.as_uri()
    )
    r = cli("--root", str(world2.root), "apply", "demo")
    assert r.code == 5 and "contains '..'" in r.err
    assert not (tmp_path.parent / "escape.py").exists() and not (world2.root / "escape.py").exists()


def test_prebuilt_compiles_into_the_wheel_and_retags_it(world2: World, cli: Cli, tmp_path: Path) -> None:
    shutil.copy(Path(__file__).parent / "data" / "prebuilt_demo.py", world2.root / "prebuilt_demo.py")
    manifest = world2.root / "overlays" / "demo.toml"
    manifest.write_text(
        manifest.read_text()
        + (
            '\n[prebuilt]\ncommand = ["{python}", "prebuilt_demo.py", "{tree}", "{out}", "{info}"]\n'
            'tag = "cp{py}-cp{py}-linux_x86_64"\ndescription = "needs gcc"\n'
        )
    )
    r = cli("--root", str(world2.root), "-q", "apply", "demo", "--prebuilt", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    wheel = Path(data["wheel"])
    py = f"{sys.version_info[0]}{sys.version_info[1]}"
    assert wheel.name.endswith(f"-cp{py}-cp{py}-linux_x86_64.whl")
    files = members(wheel)
    so = [n for n in files if n.startswith("demo_native") and n.endswith(".so")]
    assert len(so) == 1
    wheel_meta = next(v for k, v in files.items() if k.endswith(".dist-info/WHEEL")).decode()
    assert "Root-Is-Purelib: false" in wheel_meta and f"Tag: cp{py}-cp{py}-linux_x86_64" in wheel_meta
    prov = data["provenance"]["prebuilt"]
    assert prov["files"][0]["path"] == so[0] and prov["details"]["compiler"]
    # the compiled module is real and was built from the patched tree (util.py has 3 x's after patch 0002)
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
    )
    out = subprocess.run(
        [sys.executable, "-c", "import demo_native; print(demo_native.answer())"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "3", out.stderr
    no = cli(
        "--root", str(world2.root), "apply", "demo", "--prebuilt", "--prebuilt-python", "/nonexistent/python"
    )
    assert no.code == 2 and "/nonexistent/python" in no.err
