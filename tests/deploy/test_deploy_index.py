"""`overlay publish`: a static index pip installs from, over loopback HTTP, with --index-url or --find-links and
--require-hashes; the #sha256 fragments and the requirements' hashes are enforced; the pitfalls are real."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.deploy_support import REPO, make_venv, pip
from overlay.cli.main import main
from overlay.core.manifest import load_engine

pytestmark = pytest.mark.network


def installed_version(python: Path) -> str:
    r = pip(python, "list", "--format", "json")
    versions: dict[str, str] = {d["name"]: d["version"] for d in json.loads(r.stdout)}
    return versions.get("mlx-lm", "")


def test_the_index_lists_every_file_with_its_hash(mlx_built: tuple[Path, Path]) -> None:
    _wheels, index = mlx_built
    record = json.loads((index / "overlay-index.json").read_text())
    assert record["version"] == 1 and record["engine"] == "mlx-lm" and record["import_name"] == "mlx_lm"
    files = record["files"]
    manifest = load_engine(REPO, "mlx-lm")
    assert [f["artifact"]["filename"] for f in files] == [
        a.filename for a in manifest.upstream.artifacts if a.is_wheel
    ]
    page = (index / "simple" / "mlx-lm" / "index.html").read_text()
    data = json.loads((index / "simple" / "mlx-lm" / "index.json").read_text())
    assert data["meta"]["api-version"] == "1.1" and data["versions"] == [record["wheel_version"]]
    for f in files:
        digest = hashlib.sha256((index / f["filename"]).read_bytes()).hexdigest()
        assert digest == f["sha256"] and f"#sha256={digest}" in page
        entry = next(e for e in data["files"] if e["filename"] == f["filename"])
        assert entry["hashes"] == {"sha256": digest}
        meta = (index / (f["filename"] + ".metadata")).read_bytes()
        assert entry["core-metadata"] == {"sha256": hashlib.sha256(meta).hexdigest()}
        assert f"--hash=sha256:{digest}" in (index / "requirements.txt").read_text()
    assert (index / "constraints.txt").read_text().endswith(f"mlx-lm=={record['wheel_version']}\n")
    stock = (index / "requirements-stock.txt").read_text()
    assert "mlx-lm==0.32.2 \\\n" in stock and f"--hash=sha256:{manifest.upstream.primary.sha256}" in stock


def test_pip_installs_from_the_served_index_with_hashes(
    mlx_built: tuple[Path, Path], served: str, stock_wheel: Path, tmp_path: Path
) -> None:
    _wheels, index = mlx_built
    want = json.loads((index / "overlay-index.json").read_text())["wheel_version"]
    py = make_venv(tmp_path / "venv")
    req = str(index / "requirements.txt")
    r = pip(py, "install", "--no-deps", "--require-hashes", "--index-url", served + "simple/", "-r", req)
    assert r.returncode == 0, r.stderr
    assert installed_version(py) == want
    assert subprocess_check(py, index) == 0
    pip(py, "uninstall", "-y", "mlx-lm")
    r = pip(py, "install", "--no-deps", "--require-hashes", "--no-index", "--find-links", served, "-r", req)
    assert r.returncode == 0, r.stderr
    assert installed_version(py) == want

    # the pitfall: with stock installed, `==UPSTREAM` from the index is "already satisfied" and keeps stock ...
    r = pip(py, "install", "--no-deps", "--no-index", "--force-reinstall", str(stock_wheel))
    assert r.returncode == 0 and installed_version(py) == "0.32.2"
    r = pip(py, "install", "--no-deps", "--no-index", "--find-links", served, "mlx-lm==0.32.2")
    assert r.returncode == 0 and "already satisfied" in r.stdout and installed_version(py) == "0.32.2"
    assert subprocess_check(py, index) == 1  # ... and the image check catches it
    # ... while --force-reinstall with the hash-pinned requirements replaces it
    r = pip(
        py,
        "install",
        "--no-deps",
        "--force-reinstall",
        "--require-hashes",
        "--no-index",
        "--find-links",
        served,
        "-r",
        req,
    )
    assert r.returncode == 0 and installed_version(py) == want


def subprocess_check(py: Path, index: Path) -> int:
    return subprocess.run(
        [str(py), str(index / "check_installed.py")], capture_output=True, timeout=120
    ).returncode


def test_a_changed_file_in_the_index_is_refused_by_pip(mlx_built: tuple[Path, Path], tmp_path: Path) -> None:
    _wheels, index = mlx_built
    bad = tmp_path / "bad-index"
    shutil.copytree(index, bad)
    record = json.loads((bad / "overlay-index.json").read_text())
    wheel = bad / record["files"][0]["filename"]
    wheel.write_bytes(
        wheel.read_bytes() + b"\0"
    )  # a zip with trailing bytes still opens: only the hash can tell
    got = tmp_path / "got"
    r = pip(
        Path(sys.executable),
        "download",
        "--no-deps",
        "--require-hashes",
        "--no-index",
        "--find-links",
        str(bad),
        "-d",
        str(got),
        "-r",
        str(bad / "requirements.txt"),
    )
    assert r.returncode != 0 and "DO NOT MATCH THE HASHES" in r.stderr
    assert not got.exists() or not list(got.iterdir())
    r = pip(
        Path(sys.executable),
        "download",
        "--no-deps",
        "--require-hashes",
        "--no-index",
        "--find-links",
        str(index),
        "-d",
        str(got),
        "-r",
        str(index / "requirements.txt"),
    )
    assert r.returncode == 0 and [p.name for p in got.iterdir()] == [record["files"][0]["filename"]]


def test_publish_refuses_a_foreign_folder_and_replaces_its_own(
    mlx_built: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels, _index = mlx_built
    foreign = tmp_path / "docs"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    code = main(["--root", str(REPO), "publish", "mlx-lm", "--to", str(foreign), "--wheels", str(wheels)])
    assert code == 2 and "is a folder with other content" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["keep.txt"]
    ours = tmp_path / "index"
    for _ in range(2):  # the second run replaces the first whole
        assert (
            main(["--root", str(REPO), "-q", "publish", "mlx-lm", "--to", str(ours), "--wheels", str(wheels)])
            == 0
        )
    assert (ours / "overlay-index.json").is_file() and not list(tmp_path.glob(".index.*"))
    empty = tmp_path / "nowheels"
    empty.mkdir()
    code = main(
        ["--root", str(REPO), "publish", "mlx-lm", "--to", str(tmp_path / "i2"), "--wheels", str(empty)]
    )
    err = capsys.readouterr().err
    assert (
        code == 2
        and "is not built" in err
        and "overlay apply mlx-lm" in err
        and not (tmp_path / "i2").exists()
    )


def uv_binary() -> str | None:
    beside = Path(sys.executable).parent / "uv"
    return shutil.which("uv") or (str(beside) if beside.is_file() else None)


def test_uv_installs_from_the_index_and_overlay_install_works_without_pip(
    mlx_built: tuple[Path, Path],
    served: str,
    stock_wheel: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    uv = uv_binary()
    if uv is None:
        pytest.skip("uv is not installed (it is in the test extra)")
    wheels, index = mlx_built
    want = json.loads((index / "overlay-index.json").read_text())["wheel_version"]
    env = {**os.environ, "UV_NO_CACHE": "1"}
    subprocess.run(
        [uv, "venv", "-q", "--python", sys.executable, str(tmp_path / "uvenv")],
        check=True,
        env=env,
        timeout=120,
    )
    py = tmp_path / "uvenv" / "bin" / "python"
    req = str(index / "requirements.txt")
    for source in (
        ["--index-url", served + "simple/"],
        ["--no-index", "--find-links", served],
        ["--no-index", "--find-links", str(index)],
    ):
        r = subprocess.run(
            [
                uv,
                "pip",
                "install",
                "--python",
                str(py),
                "--no-deps",
                "--reinstall",
                "--require-hashes",
                *source,
                "-r",
                req,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        assert subprocess_check(py, index) == 0
    # the uv venv has no pip: overlay revert / install go through uv
    assert main(["--root", str(REPO), "-q", "revert", "mlx-lm", "--python", str(py)]) == 0
    code = main(
        ["--root", str(REPO), "-q", "install", "mlx-lm", "--python", str(py), "--wheels", str(wheels)]
    )
    assert code == 0, capsys.readouterr().err
    assert f"installed mlx-lm {want}" in capsys.readouterr().out
