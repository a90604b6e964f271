"""`overlay install / revert / status` in an existing venv, on the real mlx-lm pin: stock verified against the pinned
RECORD before anything is replaced, the patched wheel verified after, the stock bytes put back on revert."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from deploy.deploy_support import REPO, make_venv, pip
from overlay.cli.main import main
from support import record_hash

pytestmark = pytest.mark.network


def site(py: Path) -> Path:
    return next((py.parent.parent / "lib").glob("python3*/site-packages"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["--root", str(REPO), *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_install_status_revert_round_trip(
    mlx_built: tuple[Path, Path], stock_wheel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels, index = mlx_built
    want = json.loads((index / "overlay-index.json").read_text())["wheel_version"]
    py = make_venv(tmp_path / "venv")
    code, _out, err = run(capsys, "install", "mlx-lm", "--python", str(py), "--wheels", str(wheels))
    assert code == 2 and "mlx-lm is not installed for" in err
    assert pip(py, "install", "--no-deps", "--no-index", str(stock_wheel)).returncode == 0

    code, out, _err = run(capsys, "status", "--python", str(py), "--json")
    mlx = next(e for e in json.loads(out)["engines"] if e["engine"] == "mlx-lm")
    assert code == 0 and mlx["kind"] == "stock" and mlx["files_ok"] and mlx["pin_checked"]

    code, out, err = run(capsys, "install", "mlx-lm", "--python", str(py), "--wheels", str(wheels), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["action"] == "installed" and data["before"] == {"version": "0.32.2", "kind": "stock"}
    assert data["after"]["version"] == want and data["import"].startswith(str(site(py).resolve()))
    code, out, _ = run(capsys, "status", "--python", str(py))
    assert code == 0 and f"mlx-lm {want} (patched, " in out and ", current); files match RECORD" in out
    code, out, _ = run(capsys, "install", "mlx-lm", "--python", str(py), "--wheels", str(wheels))
    assert code == 0 and out.startswith("unchanged ")

    target = site(py) / "mlx_lm" / "generate.py"
    target.write_text(target.read_text() + "# edited in place\n")
    code, out, _ = run(capsys, "status", "--python", str(py))
    assert code == 5 and "mlx_lm/generate.py was modified" in out
    code, _, err = run(capsys, "install", "mlx-lm", "--python", str(py), "--wheels", str(wheels))
    assert code == 5 and "was modified: mlx_lm/generate.py" in err

    code, out, err = run(capsys, "revert", "mlx-lm", "--python", str(py))
    assert code == 0, err
    assert out.startswith("reverted mlx-lm 0.32.2 (stock, was patched")
    code, out, _ = run(capsys, "status", "--python", str(py))
    assert code == 0 and "mlx-lm 0.32.2 (stock); files match RECORD and the pin" in out
    code, out, _ = run(capsys, "revert", "mlx-lm", "--python", str(py))
    assert code == 0 and out.startswith("unchanged ")


def test_a_different_stock_build_is_refused_naming_the_file(
    mlx_built: tuple[Path, Path], stock_wheel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same name and version, consistent RECORD, one file changed: only the pinned RECORD tells it apart."""
    wheels, _ = mlx_built
    with zipfile.ZipFile(stock_wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    files["mlx_lm/sample_utils.py"] += b"\n# a rebuilt release\n"
    record = next(n for n in files if n.endswith(".dist-info/RECORD"))
    files[record] = (
        "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in files.items() if n != record) + f"{record},,\n"
    ).encode()
    other = tmp_path / "other" / stock_wheel.name
    other.parent.mkdir()
    with zipfile.ZipFile(other, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    py = make_venv(tmp_path / "venv")
    assert pip(py, "install", "--no-deps", "--no-index", str(other)).returncode == 0
    code, _, err = run(capsys, "install", "mlx-lm", "--python", str(py), "--wheels", str(wheels))
    assert code == 5, err
    assert "is not the pinned stock release: mlx_lm/sample_utils.py differs from the pinned wheel" in err, err
    assert "overlay revert mlx-lm" in err
    code, out, _ = run(capsys, "revert", "mlx-lm", "--python", str(py))
    assert code == 0 and out.startswith("reverted mlx-lm 0.32.2 (stock, was stock")
    code, _, err = run(capsys, "install", "mlx-lm", "--python", str(py), "--wheels", str(wheels))
    assert code == 0, err


def test_a_source_checkout_shadowing_the_wheel_fails_the_install(
    mlx_built: tuple[Path, Path],
    stock_wheel: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wheels, _ = mlx_built
    py = make_venv(tmp_path / "venv")
    assert pip(py, "install", "--no-deps", "--no-index", str(stock_wheel)).returncode == 0
    checkout = tmp_path / "checkout"
    (checkout / "mlx_lm").mkdir(parents=True)
    (checkout / "mlx_lm" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(checkout))
    code, _, err = run(capsys, "install", "mlx-lm", "--python", str(py), "--wheels", str(wheels))
    assert code == 5 and f"resolves to {checkout}" in err and "shadows the wheel" in err
    monkeypatch.delenv("PYTHONPATH")
    code, out, _ = run(capsys, "status", "--python", str(py))
    assert code == 0 and "(patched, " in out  # installed and verified; only the import was shadowed
    assert os.environ.get("PYTHONPATH") is None
