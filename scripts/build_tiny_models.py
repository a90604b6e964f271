#!/usr/bin/env python3
"""Build every tiny model kind, report sizes and build times, and (with --measure) what the trained ones are worth.

    scripts/build_tiny_models.py [--root DIR] [--python PATH|stock] [--kinds KIND ...] [--measure] [--json FILE]

--python: interpreter with mlx and mlx-lm for trained kinds ('stock' = the stock mlx-lm arm of overlay.check.envs);
default: this interpreter if it imports mlx, else the stock arm.
--measure (needs that interpreter too):
  - MTP acceptance of qwen3_5-mtp with the reference speculative loop (overlay/tinymodels/mlx_mtp.py), k = 1 and 3,
    over PROMPTS, greedy, 48 tokens per prompt; and the same for qwen3_5-random (a random head: about 0);
  - heavy kinds vs their base: bit-identical logits, identical greedy tokens, decode cost ratio (CPU ms/token);
  - stock mlx-lm draft-model speculation (k=3): drafted share and time ratio vs serial, for llama-target and
    llama-heavy with llama-draft / llama-draft-random.
Writes build/reports/tinymodels.json ({"version": 1, ...}). Timings on a shared 2-core machine are noisy: compare
CPU seconds and ratios, not wall seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from overlay.check.models import KINDS, all_prompts, build, is_trained, read_manifest, stock_mlx_python
from overlay.check.models.common import load_tensors
from overlay.check.models.mlxproc import run_mlx_script
from overlay.check.models.tokenizer import train_tokenizer
from overlay.fsutil import atomic_write_json
from overlay.progress import Stage


class Printer:
    def step(self, stage: Stage, message: str) -> None:
        print(f"{stage}: {message}", file=sys.stderr, flush=True)

    def advance(self, stage: Stage, done: int, total: int) -> None:
        pass


def resolve_python(root: Path, value: str | None) -> Path:
    if value == "stock" or (value is None and importlib.util.find_spec("mlx") is None):
        return stock_mlx_python(root, reporter=Printer())
    return Path(value) if value else Path(sys.executable)


def measure(root: Path, python: Path, dirs: dict[str, Path]) -> dict[str, Any]:
    tokenizer = train_tokenizer()
    prompts = [tokenizer.encode(p).ids for _, p in all_prompts()]
    out: dict[str, Any] = {}

    def run(payload: dict[str, Any], what: str) -> dict[str, Any]:
        print(f"measure: {what}", file=sys.stderr, flush=True)
        return run_mlx_script(python, payload, what)

    for kind in ("qwen3_5-mtp", "qwen3_5-random"):
        if kind in dirs:
            out[f"mtp_acceptance/{kind}"] = run(
                {
                    "task": "measure_mtp",
                    "model": str(dirs[kind]),
                    "prompts": prompts,
                    "max_tokens": 48,
                    "k": [1, 3],
                },
                f"MTP acceptance of {kind}",
            )
    for heavy, base in (("llama-heavy", "llama-target"), ("qwen3_5-mtp-heavy", "qwen3_5-mtp")):
        if heavy in dirs and base in dirs:
            out[f"heavy/{heavy}"] = run(
                {
                    "task": "compare_models",
                    "base": str(dirs[base]),
                    "other": str(dirs[heavy]),
                    "prompts": prompts,
                    "max_tokens": 32,
                },
                f"{heavy} vs {base}",
            )
    for target in ("llama-target", "llama-heavy"):
        for draft in ("llama-draft", "llama-draft-random"):
            if target in dirs and draft in dirs:
                out[f"draft/{target}+{draft}"] = run(
                    {
                        "task": "measure_draft",
                        "target": str(dirs[target]),
                        "draft": str(dirs[draft]),
                        "prompts": prompts[::2],
                        "max_tokens": 48,
                        "k": 3,
                    },
                    f"{draft} drafting for {target}",
                )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--root", type=Path, default=REPO, help="repository whose build/models/ caches the models"
    )
    parser.add_argument("--python", help="interpreter with mlx + mlx-lm, or 'stock'")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), help="kinds to build (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--measure", action="store_true", help="acceptance, heavy identity and cost, draft speedups"
    )
    parser.add_argument("--json", type=Path, help="report path (default: ROOT/build/reports/tinymodels.json)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    needs_mlx = args.measure or any(is_trained(k) for k in args.kinds)
    python = resolve_python(root, args.python) if needs_mlx else None

    rows, dirs = [], {}
    for kind in args.kinds:
        path = build(kind, root=root, seed=args.seed, python=python, reporter=Printer())
        dirs[kind] = path
        manifest = read_manifest(path)
        timings = json.loads((path / "timings.json").read_text())
        size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
        rows.append(
            {
                "kind": kind,
                "dir": path.name,
                "parameters": manifest["parameters"],
                "tensors": manifest["tensors"],
                "mtp_tensors": len(manifest["mtp_tensors"]),
                "bytes": size,
                "timings": timings,
                "training": manifest.get("training"),
            }
        )
    tensors_total = {k: len(load_tensors(d / "model.safetensors")) for k, d in dirs.items()}

    print(
        f"{'kind':<20} {'params':>10} {'MB':>7} {'tensors':>7} {'mtp':>4} {'build s':>8} {'train cpu s':>11}"
    )
    for r in rows:
        t = r["timings"]
        cpu = sum(v for k, v in t.items() if k.endswith("cpu_s"))
        print(
            f"{r['kind']:<20} {r['parameters']:>10} {r['bytes'] / 1e6:>7.2f} {tensors_total[r['kind']]:>7} "
            f"{r['mtp_tensors']:>4} {t.get('total_s', 0):>8.1f} {cpu:>11.1f}"
        )
    report: dict[str, Any] = {
        "version": 1,
        "root": str(root),
        "seed": args.seed,
        "python": str(python),
        "kinds": rows,
    }
    if args.measure:
        assert python is not None
        report["measurements"] = measure(root, python, dirs)
        for name, value in report["measurements"].items():
            print(f"{name}: {json.dumps(value)}")
    target = args.json or root / "build" / "reports" / "tinymodels.json"
    atomic_write_json(target, report)
    print(f"report: {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
