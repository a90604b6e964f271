"""The layering of src/overlay (docs/dev/architecture.md) is a contract, checked here and in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "overlay"

# "About 400 lines" (as `ruff format` writes them): at most MAX_LINES. The modules above it are listed with the size
# they may not grow past (split them along their seams, then drop them from this table).
MAX_LINES = 450
OVERSIZE: dict[str, int] = {}


def test_the_layers_contract_holds() -> None:
    """cli -> engines -> {check | upstream | deploy} -> stack -> core -> git -> {fsutil, paths, progress} -> errors."""
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in proc.stdout


def _cycles() -> list[list[str]]:
    graph = grimp.build_graph(
        "overlay", include_external_packages=False, exclude_type_checking_imports=True, cache_dir=None
    )
    mods = sorted(graph.modules)
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in mods:
        if m not in index:
            visit(m)
    return found


def test_no_import_cycles_between_modules() -> None:
    assert _cycles() == []


def test_modules_stay_small() -> None:
    too_big = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > OVERSIZE.get(rel, MAX_LINES):
            too_big[rel] = lines
    assert not too_big, f"split these along their seams (limit {MAX_LINES} lines): {too_big}"
    gone = [
        rel
        for rel in OVERSIZE
        if not (SRC / rel).is_file() or len((SRC / rel).read_text(encoding="utf-8").splitlines()) <= MAX_LINES
    ]
    assert not gone, f"drop these from OVERSIZE, they are small now: {gone}"


def test_stand_ins_live_outside_the_package() -> None:
    assert not (SRC / "testbackends").exists()
    assert (REPO / "support" / "testbackends").is_dir()
    for manifest in (REPO / "overlays").glob("*.toml"):
        assert "src/overlay" not in manifest.read_text(encoding="utf-8"), manifest.name
