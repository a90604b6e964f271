#!/usr/bin/env python3
"""vLLM device check: on CUDA, the series' patched sampling functions must be stock's. Standard library only here
(torch in the comparison); the probes run in vllm_probes.py processes.

vLLM 0.32.0's CUDA wheel cannot travel to the device (326.5 MB; the carry limit is 64 MiB with the repository), so
``scripts/device_check.sh prepare`` carries the Python files its probed modules import (stock, and the series' changes
to them) and the dependencies the GPU image lacks (scripts/device/vllm_prepare.py); its native modules are labelled
stand-ins (vllm_native.py). The series' sampling patches (0006-0011) gate themselves to the CPU path, so what one GPU
can check is that CUDA takes stock's path with every flag of the series set:

1. the real functions (``apply_top_k_top_p`` and its PyTorch path, ``TopKTopPSampler.forward_native`` with seeded
   generators, ``Sampler.forward``, ``apply_all_penalties``, ``expand_batch_to_tokens``, ``apply_sampling_constraints``,
   ``rejection_sample``) on CUDA tensors in three configurations, each in its own process: ``stock`` (the flags set,
   which stock ignores), ``flag_off`` (patched, no flag) and ``patched`` (every flag); outputs compared bit for bit;
2. the census of each call (cuda_census: host syncs, launches, copies, bytes) compared: expected equal;
3. every function the series adds to a probed module (found by comparing the two trees' top-level functions) wrapped
   to count its calls: on CUDA none may be entered;
4. the imports those modules pull in (0002 and 0003: the OpenAI protocol stack and Inductor), per configuration;
5. a go/no-go for a CUDA variant of 0008: stock's dense ``apply_penalties`` against 0008's algorithm at a 151936
   vocabulary, interleaved, with intervals (reported, never gated; vllm_probes.go_no_go).

A case is ``neutral`` (True) when stock and patched both ran, gave the same bytes, counted the same and the patched arm
entered none of the series' functions; False when any of that differs; None when it could not run in either arm (a
native module it needs is a stand-in): not measured, never a pass. ``--dry-run`` runs the same code on CPU tensors in
the vLLM CPU arm's Python, where the patches do take their CPU branches: there the check must find them (entered,
outputs or counts differing), which shows it can fail; a dry run's verdict is about the harness only.

Output (``--out``, atomic): ``{"version": 2, "engine": "vllm", "dry_run", "machine", "budget", "carry", "configs",
"watched", "measurements": [{"key", "patches", "region", "status", "reason", "neutral", "cases"}], "imports",
"timing"}``. Exit 0: the harness ran (a dry run), or every measured case is neutral (the GPU); 4: a case is not
neutral on the GPU; 1: the harness failed; 2: bad input (no carry, a stale one, a tree that fails its hashes).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import plan

SCHEMA_VERSION = 2
CONFIGS = ("stock", "flag_off", "patched")
COMPARED = ("host-syncs", "eager-launches", "graph-launches", "h2d-copies", "pageable-copies", "bytes-moved")


class CarryError(Exception):
    """The carried trees cannot be used (exit 2)."""


# --- the trees -------------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extract(archive: Path, into: Path) -> None:
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or member.name.startswith("/") or ".." in Path(member.name).parts:
                raise CarryError(f"{archive.name}: unsafe or unexpected member {member.name!r}")
        tar.extractall(into, filter="data") if sys.version_info >= (3, 12) else tar.extractall(into)


def unpack(carry: Path, work: Path, *, deps: bool) -> tuple[dict[str, Path], dict[str, Any], Path | None]:
    """The stock and patched trees (and the dependency site) under ``work``, every file checked against the
    manifest; returns ({"stock": dir, "patched": dir}, manifest, site)."""
    path = carry / "manifest.json"
    if not path.is_file():
        raise CarryError(
            f"{path} is missing: run `bash scripts/device_check.sh prepare` where the index is reachable"
        )
    manifest = json.loads(path.read_text())
    for name, info in manifest["archives"].items():
        if not (carry / name).is_file() or _sha256(carry / name) != info["sha256"]:
            raise CarryError(f"{carry / name} is missing or does not match its sha256 in the manifest")
    trees = {"stock": work / "stock", "patched": work / "patched"}
    _extract(carry / "stock.tar.xz", trees["stock"])
    _extract(carry / "stock.tar.xz", trees["patched"])
    _extract(carry / "patched.tar.xz", trees["patched"])
    for arm, tree in trees.items():
        wanted = manifest["files"][arm]
        for rel, digest in wanted.items():
            if not (tree / rel).is_file() or _sha256(tree / rel) != digest:
                raise CarryError(f"the {arm} tree's {rel} does not match the manifest (sha256)")
        for extra in [p for p in tree.rglob("*") if p.is_file() and str(p.relative_to(tree)) not in wanted]:
            extra.unlink()  # stock files the patched wheel's closure does not hold
        for folder in sorted((p for p in tree.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            if not any(folder.iterdir()):
                folder.rmdir()  # stock's emptied .dist-info would answer importlib.metadata.version("vllm") with None
    site = None
    if deps:
        site = work / "site"
        _extract(carry / "deps-cp312.tar.xz", site)
    return trees, manifest, site


def added_functions(stock: Path, patched: Path, modules: list[str]) -> dict[str, list[str]]:
    """Per probed module, the top-level functions the patched tree defines and stock does not."""

    def names(tree: Path, module: str) -> set[str]:
        base = tree / module.replace(".", "/")
        path = base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")
        if not path.is_file():
            return set()
        body = ast.parse(path.read_text(encoding="utf-8")).body
        return {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    out = {}
    for module in modules:
        added = sorted(names(patched, module) - names(stock, module))
        if added:
            out[module] = added
    return out


# --- the workers -----------------------------------------------------------------------------------------------------


def _worker(cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> tuple[int, float]:
    t0 = time.monotonic()
    try:
        with log.open("w") as fh:
            rc = subprocess.run(
                cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=max(10.0, timeout)
            ).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    return rc, round(time.monotonic() - t0, 1)


def run_configs(
    *,
    trees: dict[str, Path],
    manifest: dict[str, Any],
    flags: dict[str, str],
    watch: dict[str, list[str]],
    site: Path | None,
    dry_run: bool,
    work: Path,
    logs: Path,
    deadline: plan.Deadline,
    jobs: int,
    rounds: int,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    base = [
        sys.executable,
        str(HERE / "vllm_probes.py"),
        "--native",
        json.dumps(manifest["native_modules"]),
        "--watch",
        json.dumps(watch),
        *(["--dry-run"] if dry_run else []),
    ]
    configs = {
        "stock": (trees["stock"], flags),
        "flag_off": (trees["patched"], {}),
        "patched": (trees["patched"], flags),
    }

    def one(name: str) -> tuple[str, dict[str, Any]]:
        tree, env_flags = configs[name]
        out = work / f"{name}.json"
        cmd = [
            *base,
            "--tree",
            str(tree),
            "--config",
            name,
            "--env",
            json.dumps(env_flags),
            "--out",
            str(out),
            "--outputs",
            str(work / f"{name}.pt"),
        ]
        rc, seconds = _worker(cmd, env, deadline.left(), logs / f"vllm-{name}.log")
        doc = json.loads(out.read_text()) if out.is_file() else None
        return name, {"exit_code": rc, "seconds": seconds, "log": str(logs / f"vllm-{name}.log"), "doc": doc}

    results: dict[str, Any] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for name, result in pool.map(one, CONFIGS):
            results[name] = result
            print(
                f"vllm_check: {name}: exit {result['exit_code']} in {result['seconds']} s",
                file=sys.stderr,
                flush=True,
            )
    timing = None
    if deadline.left() >= 30:
        out = work / "timing.json"
        cmd = [
            *base,
            "--tree",
            str(trees["patched"]),
            "--config",
            "timing",
            "--env",
            json.dumps(flags),
            "--timing",
            "--rounds",
            str(rounds),
            "--out",
            str(out),
        ]
        rc, seconds = _worker(cmd, env, deadline.left(), logs / "vllm-timing.log")
        doc = json.loads(out.read_text()) if out.is_file() else None
        timing = {
            "exit_code": rc,
            "seconds": seconds,
            "log": str(logs / "vllm-timing.log"),
            **((doc or {}).get("timing") or {}),
        }
    else:
        timing = {"skipped": f"over budget: {int(deadline.left())} s left, the timing needs ~30 s"}
    return results, timing


# --- the comparison --------------------------------------------------------------------------------------------------


def _load_outputs(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=False) if path.is_file() else {}


def outputs_equal(name: str, outputs: dict[str, dict[str, Any]]) -> dict[str, bool | None]:
    """Stock's outputs of case ``name`` against each other configuration's, bit for bit (None: one is missing)."""
    import torch
    import vllm_probes

    equal: dict[str, bool | None] = {}
    for other in ("flag_off", "patched"):
        a, b = outputs.get("stock", {}).get(name), outputs.get(other, {}).get(name)
        equal[f"stock_vs_{other}"] = (
            vllm_probes.bit_equal(torch, a, b) if a is not None and b is not None else None
        )
    return equal


def compare_case(rows: dict[str, dict[str, Any] | None], equal: dict[str, bool | None]) -> dict[str, Any]:
    """One case's verdict from the three configurations' rows (vllm_probes.py) and ``outputs_equal``: ``neutral``
    True (both arms ran, the same bytes, the same counts, none of the series' functions entered), False (any of that
    differs, or one arm failed where the other ran), None (neither arm could run it: not measured)."""
    out: dict[str, Any] = {
        "key": next((r["key"] for r in rows.values() if r), None),
        "note": next((r.get("note") for r in rows.values() if r and r.get("note")), None),
    }
    for cfg, row in rows.items():
        out[cfg] = (
            None
            if row is None
            else {
                "census": row.get("census"),
                "error": row.get("error"),
                "native": row.get("native"),
                "entered": row.get("entered") or {},
                "deterministic": row.get("deterministic"),
                "sites": row.get("sites"),
            }
        )
    stock, patched = rows.get("stock"), rows.get("patched")
    why: list[str] = []
    neutral: bool | None
    if stock is None or patched is None:
        neutral, why = None, ["not measured: a configuration did not report this case"]
    elif stock.get("error") and patched.get("error"):
        native = stock.get("native") and patched.get("native")
        neutral = None
        why = [
            ("not measured: needs a native module (a stand-in here): " if native else "not measured: ")
            + f"stock: {stock['error']}; patched: {patched['error']}"
        ]
    elif stock.get("error") or patched.get("error"):
        neutral = False
        why = [f"stock: {stock.get('error') or 'ok'}; patched: {patched.get('error') or 'ok'}"]
    else:
        out["equal"] = equal
        counts = {m: [((rows[c] or {}).get("census") or {}).get(m) for c in CONFIGS] for m in COMPARED}
        differ = {m: v for m, v in counts.items() if v[0] != v[2] or (rows["flag_off"] and v[0] != v[1])}
        entered = {
            f"{c}: {k}": n
            for c in ("flag_off", "patched")
            for k, n in ((rows[c] or {}).get("entered") or {}).items()
            if n
        }
        out["census_differs"] = differ
        if equal.get("stock_vs_patched") is not True:
            why.append("outputs differ from stock's (patched, every flag)")
        if equal.get("stock_vs_flag_off") is False:
            why.append("outputs differ from stock's (patched, no flag)")
        if differ:
            why.append(
                "census differs: " + ", ".join(f"{m} {v[0]} / {v[1]} / {v[2]}" for m, v in differ.items())
            )
        if entered:
            why.append(
                "the series' functions were entered: " + ", ".join(f"{k} x{n}" for k, n in entered.items())
            )
        if not (stock.get("deterministic") and patched.get("deterministic")):
            why.append(
                "not deterministic within a configuration (its two runs differ): outputs not comparable"
            )
        neutral = not why
        if neutral:
            why = ["bit-identical outputs, equal census, none of the series' functions entered"]
    out["neutral"] = neutral
    out["why"] = "; ".join(why)
    return out


def compare(results: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    docs = {c: (results[c].get("doc") or {}) for c in CONFIGS}
    outputs = {c: _load_outputs(work / f"{c}.pt") for c in CONFIGS}
    names: list[str] = []
    for c in CONFIGS:
        names += [n for n in (docs[c].get("cases") or {}) if n not in names and n != "*"]
    by_key: dict[str, dict[str, Any]] = {}
    for name in names:
        rows = {c: (docs[c].get("cases") or {}).get(name) for c in CONFIGS}
        case = compare_case(rows, outputs_equal(name, outputs))
        by_key.setdefault(case["key"] or "?", {})[name] = case
    measurements = []
    for probe in plan.VLLM_PROBES:
        m: dict[str, Any] = {
            "key": probe.key,
            "patches": list(probe.patches),
            "region": probe.region,
            "status": "ok",
            "reason": None,
        }
        if probe.pending:
            m.update(status="skipped", reason=f"pending: {probe.pending}", neutral=None)
        elif probe.key == "imports":
            m["by_config"] = {c: (docs[c].get("info") or {}).get("imports") for c in CONFIGS}
            m["neutral"] = None  # not a neutrality check: the series is meant to change what is imported
            if not all(m["by_config"].values()):
                m.update(status="failed", reason="a configuration did not report its imports")
        elif probe.key == "penalties-timing":
            continue  # reported under "timing"
        else:
            cases = by_key.get(probe.key) or {}
            m["cases"] = cases
            verdicts = [c["neutral"] for c in cases.values()]
            if not cases:
                m.update(status="failed", reason="no configuration ran its cases", neutral=None)
            elif any(v is False for v in verdicts):
                m["neutral"] = False
            elif any(v is True for v in verdicts):
                m["neutral"] = True
            else:
                m.update(neutral=None, reason="not measured: no case ran in both arms")
        measurements.append(m)
    return measurements


def run(args: argparse.Namespace) -> int:
    deadline = plan.Deadline(args.budget)
    logs = args.logs
    logs.mkdir(parents=True, exist_ok=True)
    plan_doc = json.loads(args.plan.read_text()) if args.plan else {}
    flags = dict(plan_doc.get("flags") or {})
    with tempfile.TemporaryDirectory(prefix="vllm-check-") as tmp:
        work = Path(tmp)
        try:
            trees, manifest, site = unpack(args.carry, work, deps=not args.dry_run)
        except (CarryError, OSError, KeyError, ValueError, tarfile.TarError) as exc:
            print(f"vllm_check: error: {exc}", file=sys.stderr)
            return 2
        watch = added_functions(trees["stock"], trees["patched"], manifest["probed"])
        print(f"vllm_check: the series adds {watch}", file=sys.stderr, flush=True)
        results, timing = run_configs(
            trees=trees,
            manifest=manifest,
            flags=flags,
            watch=watch,
            site=site,
            dry_run=args.dry_run,
            work=work,
            logs=logs,
            deadline=deadline,
            jobs=args.jobs,
            rounds=args.rounds,
        )
        measurements = compare(results, work)
    configs = {
        c: {
            "exit_code": r["exit_code"],
            "seconds": r["seconds"],
            "log": r["log"],
            "info": (r.get("doc") or {}).get("info"),
            "stood_in": (r.get("doc") or {}).get("stood_in"),
            "watched": (r.get("doc") or {}).get("watched"),
            "error": ((r.get("doc") or {}).get("cases") or {}).get("*"),
        }
        for c, r in results.items()
    }
    machine = (configs["stock"].get("info") or {}) if configs.get("stock") else {}
    report = {
        "version": SCHEMA_VERSION,
        "engine": "vllm",
        "dry_run": args.dry_run,
        "machine": {k: machine.get(k) for k in ("gpu", "torch", "cuda", "triton", "platform", "has_triton")},
        "budget": {"seconds": args.budget, "used": round(args.budget - deadline.left(), 1)},
        "carry": {
            "wheels": manifest["wheels"],
            "archives": manifest["archives"],
            "native_modules": manifest["native_modules"],
            "files": {arm: len(v) for arm, v in manifest["files"].items()},
        },
        "flags": flags,
        "watched": watch,
        "configs": configs,
        "measurements": measurements,
        "timing": timing,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(report, indent=2, default=str) + "\n")
    os.replace(partial, args.out)
    harness_ok = all(r["exit_code"] == 0 and r.get("doc") for r in results.values()) and not any(
        m["status"] == "failed" for m in measurements
    )
    not_neutral = [m["key"] for m in measurements if m.get("neutral") is False]
    print(
        f"vllm_check: wrote {args.out} (harness {'ok' if harness_ok else 'FAILED'}; not neutral: "
        f"{not_neutral or 'none'})",
        file=sys.stderr,
    )
    if not harness_ok:
        return 1
    return 0 if (args.dry_run or not not_neutral) else 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--carry",
        type=Path,
        default=REPO / "build" / "device-carry" / "vllm",
        help="what `device_check.sh prepare` made (default build/device-carry/vllm)",
    )
    ap.add_argument(
        "--plan", type=Path, help="the resolved plan (device_check.py writes it: the series' flags)"
    )
    ap.add_argument("--out", type=Path, default=Path("vllm-device.json"), help="JSON report (atomic write)")
    ap.add_argument("--logs", type=Path, default=REPO / "build" / "device", help="the workers' logs")
    ap.add_argument(
        "--budget", type=float, default=float(plan.VLLM_S), help="seconds for the whole vLLM check"
    )
    ap.add_argument("--jobs", type=int, default=3, help="configurations run at once (default 3)")
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per function in the 0008 go/no-go")
    ap.add_argument(
        "--dry-run", action="store_true", help="CPU tensors in the vLLM CPU arm's Python: harness only"
    )
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
