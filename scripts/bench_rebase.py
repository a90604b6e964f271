#!/usr/bin/env python3
"""Benchmark (not a test): how long `overlay rebase` takes to move a series onto another upstream release.

    .venv/bin/python scripts/bench_rebase.py [--engine mlx-lm] [--to 0.32.1] [--reps 3] [--synthetic 20]

Two series, each rebased --reps times from a fresh copy of the overlay repository (the artifacts are cached first, so
the numbers exclude the one-time download, which is timed and printed separately):

1. the engine's real series (patches/ENGINE as it is in this checkout), pinned release -> --to;
2. a synthetic series of --synthetic patches made with `overlay checkout` + `overlay refresh` on the same real upstream
   tree: one small edit at the top of each of N functions spread over the package, chosen where the release --to has
   the same function start, so the rebase completes (clean, offset or merged) instead of stopping.

Prints the median, min and max wall time, where it went (prepare: both trees into git + the old series as commits;
replay: classification and commits; publish), and the classes. Target: under 10 s for 20 patches.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from overlay.core.manifest import load_engine
from overlay.stack.checkout import checkout
from overlay.stack.refresh import refresh
from overlay.upstream.rebase import RebaseResult, abort, rebase
from overlay.upstream.releases import resolve_release, wheel_tree


class Clock:
    """A reporter that notes when the rebase's phases end."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.marks: dict[str, float] = {}

    def step(self, stage: str, message: str) -> None:
        now = time.perf_counter() - self.t0
        if message.startswith("scratch repository ready"):
            self.marks["prepare"] = now
        elif message.startswith("[") and stage == "rebase":
            self.marks["replay"] = now
        elif message.startswith("published"):
            self.marks["publish"] = now

    def advance(self, stage: str, done: int, total: int) -> None:
        pass


def fresh_root(engine: str, series_dir: Path, manifest: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="bench-rebase-"))
    (root / "overlays").mkdir()
    shutil.copy(manifest, root / "overlays" / f"{engine}.toml")
    shutil.copytree(series_dir, root / "patches" / engine)
    (root / "build").mkdir()
    (root / "build" / "cache").symlink_to(REPO / "build" / "cache")
    return root


def run_once(engine: str, series_dir: Path, manifest: Path, to: str) -> tuple[float, RebaseResult, Clock]:
    root = fresh_root(engine, series_dir, manifest)
    try:
        clock = Clock()
        t0 = time.perf_counter()
        result = rebase(root=root, engine=engine, to=to, offline=True, reporter=clock)  # type: ignore[arg-type]
        seconds = time.perf_counter() - t0
        if result.status == "stopped":
            abort(root=root, engine=engine)
        return seconds, result, clock
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(label: str, runs: list[tuple[float, RebaseResult, Clock]]) -> None:
    times = [t for t, _r, _c in runs]
    result = runs[-1][1]
    marks = runs[-1][2].marks
    counts = ", ".join(f"{k} {v}" for k, v in result.counts().items() if v)
    n = len(result.outcomes) + len(result.pending)
    prep = marks.get("prepare", 0.0)
    replay = marks.get("replay", prep) - prep
    publish = marks.get("publish", marks.get("replay", prep)) - marks.get("replay", prep)
    print(f"{label}: {n} patches, {result.from_version} -> {result.to_version}: {result.status}")
    print(
        f"  wall time: median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f}, "
        f"{len(times)} runs)"
    )
    print(f"  last run: prepare {prep:.2f} s, replay {replay:.2f} s, publish {publish:.2f} s")
    print(f"  classes: {counts}")


def synthetic_series(engine: str, to: str, count: int, workdir: Path) -> Path:
    """``count`` patches on the pinned tree, one per function whose start is the same at ``to``."""
    root = fresh_root(engine, REPO / "patches" / engine, REPO / "overlays" / f"{engine}.toml")
    series = root / "patches" / engine
    for p in series.glob("*.patch"):
        p.unlink()
    lines = (series / "series").read_text().splitlines()
    (series / "series").write_text(lines[0] + "\n")
    manifest = load_engine(root, engine)
    pin = resolve_release(root, manifest, manifest.upstream.version, primary_only=True, offline=True)
    new = resolve_release(root, manifest, to, primary_only=True, offline=True)
    old_files = wheel_tree(pin.primary_path, manifest.upstream.package_root)
    new_files = wheel_tree(new.primary_path, manifest.upstream.package_root)
    targets: list[tuple[str, int]] = []  # (path, line to insert before)
    for path in sorted(p for p in old_files if p.endswith(".py")):
        if path not in new_files:
            continue
        old_text, new_text = old_files[path].decode(), new_files[path].decode()
        try:
            tree = ast.parse(old_text)
        except SyntaxError:
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or len(node.body) < 2:
                continue
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
                first = node.body[1]
            head = "".join(old_text.splitlines(keepends=True)[node.lineno - 1 : first.lineno + 2])
            if head in new_text:
                targets.append((path, first.lineno))
                break  # one per file, so the series spreads over the package
        if len(targets) == count:
            break
    wt = checkout(root=root, engine=engine, offline=True).worktree
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@overlay.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@overlay.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    for i, (path, line) in enumerate(targets, start=1):
        target = wt / path
        text = target.read_text().splitlines(keepends=True)
        indent = text[line - 1][: len(text[line - 1]) - len(text[line - 1].lstrip())]
        text.insert(line - 1, f"{indent}_overlay_bench_{i} = None  # synthetic benchmark edit {i}\n")
        target.write_text("".join(text))
        msg = (
            f"bench: synthetic edit {i} in {path}\n\nA benchmark patch.\n\nOverlay-Theme: other\n"
            "Overlay-Numerics: exact\nOverlay-Check: scripts/bench_rebase.py\nUpstream-Status: Inappropriate benchmark\n"
        )
        subprocess.run(["git", "commit", "-qam", msg], cwd=wt, env=env, check=True)
    refresh(root=root, engine=engine)
    out = workdir / "synthetic-series"
    shutil.copytree(series, out)
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="mlx-lm")
    ap.add_argument("--to", default="0.32.1", help="the release to rebase onto (default 0.32.1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--synthetic", type=int, default=20, help="patches in the synthetic series (0: skip it)")
    args = ap.parse_args()
    manifest_path = REPO / "overlays" / f"{args.engine}.toml"
    manifest = load_engine(REPO, args.engine)
    warm = fresh_root(args.engine, REPO / "patches" / args.engine, manifest_path)
    t0 = time.perf_counter()
    resolve_release(warm, manifest, manifest.upstream.version, primary_only=True)
    resolve_release(warm, load_engine(warm, args.engine), args.to)
    print(
        f"artifacts {manifest.upstream.version} and {args.to} ready in {time.perf_counter() - t0:.2f} s "
        "(downloaded through pip only when not cached)"
    )
    shutil.rmtree(warm, ignore_errors=True)
    runs = [
        run_once(args.engine, REPO / "patches" / args.engine, manifest_path, args.to)
        for _ in range(args.reps)
    ]
    report(f"{args.engine} series (patches/{args.engine})", runs)
    if args.synthetic:
        with tempfile.TemporaryDirectory(prefix="bench-series-") as tmp:
            series = synthetic_series(args.engine, args.to, args.synthetic, Path(tmp))
            runs = [run_once(args.engine, series, manifest_path, args.to) for _ in range(args.reps)]
            report(f"synthetic series on the real {args.engine} tree", runs)
    print("target: under 10 s for 20 patches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
