#!/usr/bin/env python3
"""Benchmark, side by side in one run: `overlay apply ENGINE` (streaming: unchanged members' compressed bytes copied),
the previous in-memory path (unpack every member, patch, recompress every member), a bare unzip + re-zip of the same
wheel, and building every pinned artifact; wall time and peak memory (RSS) of each.

    .venv/bin/python scripts/bench_apply.py [ENGINE] [--reps N]

Each arm runs in a fresh interpreter, in interleaved order; the time is that of the operation alone, the peak RSS
that of the process (its import-only baseline printed too). Targets (issue 19): apply <= 0.5x bare; peak memory
proportional to the changed members; every artifact < 2x one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import io, json, resource, sys, time, zipfile
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from overlay.core.build import apply_engine
from overlay.core.sources import member_policy
from overlay.core.series import load_engine_series
from overlay.deploy.artifacts import apply_all
from overlay.core.fetch import fetch_artifact
from overlay.core.manifest import load_engine
from overlay.core.patching import apply_series
from overlay.core.provenance import PROVENANCE_FILE, build_provenance, dumps, local_version
from overlay.core.wheels import read_wheel, set_version, write_wheel

arm, engine, out, root = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]).parent
manifest = load_engine(root, engine)
wheel = fetch_artifact(root, manifest, manifest.upstream.primary, offline=True)
patches = load_engine_series(root, manifest).patches
t0 = time.perf_counter()
if arm == "stream":
    apply_engine(root=root, engine=engine, out_dir=out, offline=True, artifact_name=manifest.upstream.primary.filename,
                 allow_unlinted=True)
elif arm == "unpack":  # the in-memory path apply used before
    contents = read_wheel(wheel, policy=member_policy(manifest))
    apply_series(contents.tree, patches, package_root=manifest.upstream.package_root)
    version = local_version(manifest, patches, root=root)
    contents = set_version(contents, version)
    prov = build_provenance(manifest, patches, artifact=manifest.upstream.primary, source={"kind": "artifact"}, root=root)
    contents.tree.write(f"{contents.dist_info}/{PROVENANCE_FILE}", dumps(prov))
    write_wheel(contents, out)
elif arm == "bare":
    with zipfile.ZipFile(wheel) as zin:
        members = [(info, zin.read(info)) for info in zin.infolist()]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zout:
        for info, data in members:
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
    (out / "bare.whl").write_bytes(buf.getvalue())
elif arm == "all":
    apply_all(root=root, engine=engine, out_dir=out, offline=True, allow_unlinted=True)
elapsed = time.perf_counter() - t0 if arm != "baseline" else 0.0
print(json.dumps({"s": elapsed, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

ARMS = ("stream", "unpack", "bare", "all")


def run(arm: str, engine: str, out: Path) -> dict[str, float]:
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, arm, engine, str(out), str(REPO / "src")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{arm} failed: {proc.stderr[-2000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", nargs="?", default="sglang")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from overlay.core.fetch import fetch_all
    from overlay.core.manifest import load_engine

    manifest = load_engine(REPO, args.engine)
    fetch_all(REPO, manifest)  # warm the cache (every pinned artifact)
    wheel = manifest.upstream.primary
    n_wheels = sum(a.is_wheel for a in manifest.upstream.artifacts)
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        base = run("baseline", args.engine, Path(tmp) / "baseline")
        run("stream", args.engine, Path(tmp) / "warm")
        for rep in range(args.reps):
            order = ARMS if rep % 2 == 0 else tuple(reversed(ARMS))
            for arm in order:
                results[arm].append(run(arm, args.engine, Path(tmp) / f"{arm}-{rep}"))
    med = {arm: statistics.median(r["s"] for r in rs) for arm, rs in results.items()}
    rss = {arm: max(r["rss_mb"] for r in rs) for arm, rs in results.items()}
    from overlay.core.fetch import cached_path

    size = cached_path(REPO, wheel).stat().st_size / 1e6
    print(
        f"engine: {args.engine}  wheel: {wheel.filename} ({size:.1f} MB), {n_wheels} pinned wheels, "
        f"{args.reps} interleaved reps, each arm in a fresh interpreter (import-only peak RSS {base['rss_mb']:.0f} MB)"
    )
    print("| arm | median s | min s | max s | peak RSS MB |")
    print("| --- | --- | --- | --- | --- |")
    labels = {
        "stream": "overlay apply --artifact primary (streaming)",
        "unpack": "in-memory path (before)",
        "bare": "bare unzip + re-zip",
        "all": f"overlay apply, every artifact ({n_wheels})",
    }
    for arm in ARMS:
        ts = [r["s"] for r in results[arm]]
        print(f"| {labels[arm]} | {med[arm]:.2f} | {min(ts):.2f} | {max(ts):.2f} | {rss[arm]:.0f} |")
    print(
        f"ratio apply/bare: {med['stream'] / med['bare']:.2f}x (target <= 0.50x); before: "
        f"{med['unpack'] / med['bare']:.2f}x"
    )
    print(f"every artifact / one: {med['all'] / med['stream']:.2f}x (target < 2x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
