"""Integration on the three real pinned artifacts, downloaded from the package index (cached under build/cache).

Each engine goes the whole way on its real upstream tree: fetch (pip, sha256) -> checkout (git worktree) -> a real
edit committed with trailers -> refresh -> lint -> apply -> wheel checks. A temporary overlay repository is used so the
shipped series are not touched; the artifact cache is shared with the repository's build/cache.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from overlay.core.manifest import load_engine
from support import GIT_ENV, Cli

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.network

EDITS = {
    # engine: (file at git-root path, anchor line, inserted line)
    "mlx-lm": ("mlx_lm/sample_utils.py", "def make_sampler(", "# overlay integration test marker\n"),
    "exllamav3": ("exllamav3/version.py", "__version__", "# overlay integration test marker\n"),
    "sglang": ("python/sglang/version.py", "__version__", "# overlay integration test marker\n"),
}


@pytest.fixture(scope="module")
def real_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real")
    shutil.copytree(REPO / "overlays", root / "overlays")
    (REPO / "build" / "cache").mkdir(parents=True, exist_ok=True)
    (root / "build").mkdir()
    (root / "build" / "cache").symlink_to(REPO / "build" / "cache")
    (root / "tests").mkdir()
    (root / "tests" / "test_marker.py").write_text("def test_marker():\n    pass\n")
    for name in EDITS:
        m = load_engine(root, name)
        d = root / "patches" / name
        d.mkdir(parents=True)
        (d / "series").write_text(f"# base: {name} {m.upstream.version} {m.upstream.commit or '-'}\n")
    return root


def record_ok(files: dict[str, bytes], dist_info: str) -> None:
    rows = list(csv.reader(io.StringIO(files[f"{dist_info}/RECORD"].decode())))
    assert {r[0] for r in rows} == set(files)
    for path, digest, size in rows:
        if path.endswith("/RECORD"):
            assert digest == size == ""
            continue
        data = files[path]
        expect = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == expect and int(size) == len(data), path


@pytest.mark.parametrize("engine", list(EDITS))
def test_real_engine_end_to_end(real_root: Path, engine: str, cli: Cli) -> None:
    r = cli("--root", str(real_root), "-q", "fetch", engine)
    assert r.code == 0, r.err
    stock_wheel = Path(r.out.strip().splitlines()[0])
    manifest = load_engine(real_root, engine)
    assert hashlib.sha256(stock_wheel.read_bytes()).hexdigest() == manifest.upstream.primary.sha256

    r = cli("--root", str(real_root), "-q", "checkout", engine)
    assert r.code == 0, r.err
    wt = Path(r.out.strip())
    rel, anchor, line = EDITS[engine]
    target = wt / rel
    text = target.read_text()
    idx = text.index(anchor)
    target.write_text(text[:idx] + line + text[idx:])
    msg = (
        f"test: mark {rel}\n\nAn integration-test edit of a real upstream file.\n\nOverlay-Theme: other\n"
        "Overlay-Numerics: exact\nOverlay-Check: tests/test_marker.py::test_marker\nUpstream-Status: Inappropriate test only\nOverlay-Flag: default\n"
    )
    subprocess.run(["git", "commit", "-qam", msg], cwd=wt, env={**os.environ, **GIT_ENV}, check=True)
    assert cli("--root", str(real_root), "-q", "refresh", engine).code == 0
    lint = cli("--root", str(real_root), "lint", engine)
    assert lint.code == 0, lint.err

    r = cli("--root", str(real_root), "-q", "apply", engine, "--artifact", "primary", "--json")
    assert r.code == 0, r.err
    result = json.loads(r.out)
    wheel = Path(result["wheel"])
    assert (
        result["wheel_version"].startswith(manifest.upstream.version + "+ovl.")
        and ".1.g" in result["wheel_version"]
    )
    with zipfile.ZipFile(stock_wheel) as zs, zipfile.ZipFile(wheel) as zp:
        stock = {n: zs.read(n) for n in zs.namelist() if not n.endswith("/")}
        patched = {n: zp.read(n) for n in zp.namelist()}
    pkg_rel = rel[len(manifest.upstream.package_root) + 1 :] if manifest.upstream.package_root else rel
    stock_body = {n: d for n, d in stock.items() if ".dist-info/" not in n}
    patched_body = {n: d for n, d in patched.items() if ".dist-info/" not in n}
    assert set(stock_body) == set(patched_body)
    changed = [n for n in stock_body if stock_body[n] != patched_body[n]]
    assert changed == [pkg_rel]
    assert line.encode() in patched_body[pkg_rel]
    if engine == "sglang":
        so = [n for n in stock_body if n.endswith(".so")]
        assert len(so) >= 5  # the Rust extensions, carried byte for byte (checked above)
    dist_info = next(n.split("/")[0] for n in patched if n.endswith(".dist-info/METADATA"))
    assert dist_info.endswith(f"-{result['wheel_version']}.dist-info")
    record_ok(patched, dist_info)
    prov = json.loads(patched[f"{dist_info}/overlay.json"])
    assert prov["upstream"]["artifact"]["sha256"] == manifest.upstream.primary.sha256
    assert len(prov["series"]["patches"]) == 1
    stock_meta = next(d for n, d in stock.items() if n.endswith(".dist-info/METADATA")).decode()
    patched_meta = patched[f"{dist_info}/METADATA"].decode()
    assert (
        patched_meta.replace(f"Version: {result['wheel_version']}", f"Version: {manifest.upstream.version}")
        == stock_meta
    )
