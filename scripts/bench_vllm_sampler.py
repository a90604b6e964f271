#!/usr/bin/env python3
"""Benchmark: vLLM's sampler with top-k and top-p on the CPU build, stock vs patched (0006,
``VLLM_OVL_TOPK_TOPP_PRESELECT=1``), side by side in one run.

    .venv/bin/python scripts/bench_vllm_sampler.py [--reps N] [--tokens N] [--batches 1,4] [--vocab V] [--json FILE]

The model is the bundled tiny random llama (overlay.check.models ``llama-random``: 2 layers, hidden 64) widened to a
vocabulary of ``--vocab`` rows (default 151936, Qwen's; the added embedding and output rows random, the tokenizer
unchanged), built under build/bench/. Two engines run at once, one per arm (the stock wheel; the patched series with
the flag), each in its own process (tests/engines/vllm/probes/sampler_bench.py, the check's in-process engine: float32,
eager), and take turns: per repetition and batch size each decodes the same seeded sampled requests (temperature 0.7,
top-k 20, top-p 0.8; ``--tokens`` tokens each), the arm that goes first alternating. Decode tok/s = batch x (decode
steps) / seconds from the prefill step to the last step. Then each arm times ``apply_top_k_top_p_pytorch`` alone on the
same logits (median of 50 calls per repetition, interleaved the same way).

Ratios are patched / stock with 95 % paired log-ratio t-intervals over the repetitions (overlay.check.stats.ratio_ci);
an interval that spans 1.0 is not a speedup. The seeded tokens must be equal in both arms (float32 logits: the patch
keeps the sort path's masks, tests/engines/vllm/test_vllm_sampler.py). On this tiny model the sampler is most of a
step; the milliseconds saved per step are what carries over to a real model, whose forward adds its own time. Writes
a JSON report (default build/reports/vllm-sampler-bench.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from overlay.check import models as tinymodels
from overlay.check.envs import Arm, arms_for
from overlay.check.stats import ratio_ci, speed_verdict
from overlay.fsutil import atomic_write_text

PROBE = REPO / "tests" / "engines" / "vllm" / "probes" / "sampler_bench.py"
FLAG = {"VLLM_OVL_TOPK_TOPP_PRESELECT": "1"}
MARK = "@@sampler-bench "  # the probe's answer lines


def wide_model(vocab: int) -> Path:
    """llama-random with ``vocab`` embedding and output rows (the first 512 are the model's own)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    base = tinymodels.build("llama-random", root=REPO)
    out = REPO / "build" / "bench" / f"{base.name}-vocab{vocab}"
    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((base / "config.json").read_text())
    config["vocab_size"] = vocab
    tensors = load_file(str(base / "model.safetensors"))
    rng = np.random.default_rng(vocab)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = tensors[name]
        extra = rng.standard_normal((vocab - w.shape[0], w.shape[1])).astype(w.dtype) * float(w.std())
        tensors[name] = np.concatenate([w, extra])
    save_file(tensors, str(out / "model.safetensors.tmp"))
    atomic_write_text(out / "config.json", json.dumps(config, indent=2) + "\n")
    os.replace(out / "model.safetensors.tmp", out / "model.safetensors")
    return out


class Engine:
    """One arm's engine process (the probe), answering one command per line."""

    def __init__(self, arm: Arm, model: Path) -> None:
        env = {**os.environ, **arm.env}
        env.pop("PYTHONHOME", None)
        self.name = arm.name
        self.proc = subprocess.Popen(
            [str(arm.python), str(PROBE), str(model)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                result: dict[str, Any] = json.loads(line[len(MARK) :])
                return result
        raise SystemExit(f"bench: the {self.name} engine exited ({self.proc.wait()})")

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.ask_quit()

    def ask_quit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"task": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = wide_model(args.vocab)
    arms = arms_for(REPO, "vllm")
    patched = dataclasses.replace(arms.patched, env={**arms.patched.env, **FLAG})
    engines = {"stock": Engine(arms.stock, model), "patched": Engine(patched, model)}
    batches = [int(b) for b in args.batches.split(",")]
    tok_s: dict[str, dict[int, list[float]]] = {a: {b: [] for b in batches} for a in engines}
    fn_s: dict[str, dict[int, list[float]]] = {a: {b: [] for b in batches} for a in engines}
    identical = True
    load = [os.getloadavg()[0]]
    try:
        for rep in range(args.reps):
            order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
            for b in batches:
                tokens: dict[str, Any] = {}
                for a in order:
                    r = engines[a].ask(task="engine", batch=b, tokens=args.tokens, seed=100 * rep)
                    tok_s[a][b].append(b * r["decode_steps"] / r["seconds"])
                    tokens[a] = r["tokens"]
                identical &= tokens["stock"] == tokens["patched"]
                for a in order:
                    fn_s[a][b].append(
                        engines[a].ask(task="function", batch=b, vocab=args.vocab, reps=50)["seconds"]
                    )
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    finally:
        for e in engines.values():
            e.close()
    load.append(os.getloadavg()[0])
    rows = []
    for b in batches:
        speed = ratio_ci(tok_s["patched"][b], tok_s["stock"][b])
        fn = ratio_ci(
            fn_s["stock"][b], fn_s["patched"][b]
        )  # stock time / patched time: the function's speedup
        rows.append(
            {
                "batch": b,
                "stock_tok_s": statistics.median(tok_s["stock"][b]),
                "patched_tok_s": statistics.median(tok_s["patched"][b]),
                "decode_ratio": speed,
                "decode_verdict": speed_verdict(speed, higher_is_better=True),
                "step_ms_saved": 1e3
                * (b / statistics.median(tok_s["stock"][b]) - b / statistics.median(tok_s["patched"][b])),
                "function_ms": {a: 1e3 * statistics.median(fn_s[a][b]) for a in engines},
                "function_speedup": fn,
            }
        )
    return {
        "version": 1,
        "model": str(model.relative_to(REPO)),
        "vocab": args.vocab,
        "sampling": {"temperature": 0.7, "top_k": 20, "top_p": 0.8},
        "arms": {"stock": arms.stock.version, "patched": arms.patched.version, "flag": FLAG},
        "reps": args.reps,
        "tokens": args.tokens,
        "threads": {a: e.ready.get("threads") for a, e in engines.items()},
        "load_average": load,
        "identical_tokens": identical,
        "rows": rows,
        "samples": {"decode_tok_s": tok_s, "function_s": fn_s},
    }


def _ci(r: dict[str, Any]) -> str:
    if r["ci_low"] is None:
        return f"{r['ratio']:.2f}x"
    return f"{r['ratio']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--json", type=Path, default=REPO / "build" / "reports" / "vllm-sampler-bench.json")
    args = ap.parse_args(argv)
    report = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.json, json.dumps(report, indent=2) + "\n")
    print(
        f"model {report['model']} (vocab {report['vocab']}), {report['reps']} reps x {report['tokens']} tokens, "
        f"load {report['load_average'][0]:.2f} -> {report['load_average'][1]:.2f}, "
        f"seeded tokens identical: {report['identical_tokens']}"
    )
    print(
        "| batch | stock tok/s | patched tok/s | patched/stock [95 %] | ms saved per step | sampler ms stock -> patched | sampler speedup [95 %] |"
    )
    print("|---:|---:|---:|---|---:|---|---|")
    for r in report["rows"]:
        fm = r["function_ms"]
        print(
            f"| {r['batch']} | {r['stock_tok_s']:.1f} | {r['patched_tok_s']:.1f} | {_ci(r['decode_ratio'])} "
            f"({r['decode_verdict']}) | {r['step_ms_saved']:.2f} | {fm['stock']:.2f} -> {fm['patched']:.2f} | "
            f"{_ci(r['function_speedup'])} |"
        )
    print(f"report: {args.json}")
    return 0 if report["identical_tokens"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
