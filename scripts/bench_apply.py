#!/usr/bin/env python3
"""Benchmark: `overlay apply ENGINE` from a warm cache vs a bare unzip + re-zip of the same wheel, in one run.

    .venv/bin/python scripts/bench_apply.py [ENGINE] [--reps N]

Interleaves the two arms, reports medians and the ratio apply/bare (target: <= 1.5 for sglang).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from overlay.core.build import apply_engine
from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import load_engine


def bare_rezip(wheel: Path, out: Path) -> None:
    with zipfile.ZipFile(wheel) as zin:
        members = [(info, zin.read(info)) for info in zin.infolist()]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zout:
        for info, data in members:
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
    out.write_bytes(buf.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", nargs="?", default="sglang")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    manifest = load_engine(REPO, args.engine)
    wheel = fetch_artifact(REPO, manifest, manifest.upstream.primary)  # warm the cache
    times: dict[str, list[float]] = {"apply": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        apply_engine(root=REPO, engine=args.engine, out_dir=out / "warm")  # warm-up
        for rep in range(args.reps):
            order = ("apply", "bare") if rep % 2 == 0 else ("bare", "apply")
            for arm in order:
                t0 = time.perf_counter()
                if arm == "apply":
                    result = apply_engine(root=REPO, engine=args.engine, out_dir=out / "apply", offline=True)
                else:
                    bare_rezip(wheel, out / "bare.whl")
                times[arm].append(time.perf_counter() - t0)
    a, b = statistics.median(times["apply"]), statistics.median(times["bare"])
    print(f"engine: {args.engine}  wheel: {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB), "
          f"{len(result.patches)} patches, {args.reps} interleaved reps")
    print(f"overlay apply (warm cache): median {a:.2f} s  (min {min(times['apply']):.2f}, max {max(times['apply']):.2f})")
    print(f"bare unzip + re-zip:        median {b:.2f} s  (min {min(times['bare']):.2f}, max {max(times['bare']):.2f})")
    print(f"ratio apply/bare: {a / b:.2f}x  (target <= 1.50x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
