"""Fixtures for the deploy tests on the real mlx-lm pin: its patched wheel built once, an index published from it,
a loopback `python -m http.server` serving that index, and fresh venvs (with pip; nothing downloaded into them)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.deploy_support import REPO


@pytest.fixture(scope="session")
def mlx_built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheels folder, published index folder) for the shipped mlx-lm series."""
    from overlay.deploy.artifacts import apply_all
    from overlay.deploy.publish import publish_index

    base = tmp_path_factory.mktemp("mlx-deploy")
    wheels = base / "wheels"
    apply_all(root=REPO, engine="mlx-lm", out_dir=wheels)
    index = base / "index"
    publish_index(root=REPO, engine="mlx-lm", to=index, wheels_dir=wheels)
    return wheels, index


@pytest.fixture(scope="session")
def stock_wheel() -> Path:
    from overlay.core.fetch import fetch_artifact
    from overlay.core.manifest import load_engine

    manifest = load_engine(REPO, "mlx-lm")
    return fetch_artifact(REPO, manifest, manifest.upstream.primary)


@pytest.fixture(scope="session")
def served(mlx_built: tuple[Path, Path]) -> Iterator[str]:
    """``http://127.0.0.1:PORT/`` serving the index folder with `python -m http.server` (loopback only)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(mlx_built[1]),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):  # bounded: at most ~10 s for the server to answer
            try:
                with urllib.request.urlopen(url + "simple/", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("python -m http.server did not answer on loopback")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
