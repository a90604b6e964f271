#!/usr/bin/env python3
"""Benchmark: vLLM's sampler (top-k / top-p, penalties, the rejection sampler) on the CPU build, stock vs patched, side
by side in one run.

    .venv/bin/python scripts/bench_vllm_sampler.py [--sampling top-k-top-p|top-p|penalties|spec] [--reps N] [--tokens N]
        [--batches 1,4] [--vocab V] [--head-scale S] [--scales 3,5,8] [--json FILE]

``--sampling top-k-top-p`` (default): temperature 0.7, top-k 20, top-p 0.8, the patched arm with 0006's
``VLLM_OVL_TOPK_TOPP_PRESELECT=1``; ``--sampling top-p``: temperature 0.7, top-p 0.9 alone, with 0007's
``VLLM_OVL_TOPP_NUCLEUS=1``; ``--sampling penalties``: temperature 0.7 with repetition 1.05, presence 0.3 and frequency
0.2 penalties, with 0008's ``VLLM_OVL_SPARSE_PENALTIES=1`` (the function timed is then ``apply_all_penalties`` on rows
with a 512-token prompt and a 256-token output); ``--sampling spec``: n-gram speculation (k=3) with top-k-top-p's
requests, stock's engine dies on it (0009 fixes that), so both arms are the series with 0006's flag and the patched arm
adds 0010's ``VLLM_OVL_RECOVER_AT_REJECTION=1`` (the prompts a phrase said four times; the function timed is
``rejection_sample``, 3 drafts a request, each its position's most likely token; decode tok/s counts the tokens
decoded, several a step; the seeded tokens differ between the arms after a rejection, by design).

The model is the bundled tiny random llama (overlay.check.models ``llama-random``: 2 layers, hidden 64) widened to a
vocabulary of ``--vocab`` rows (default 151936, Qwen's; the added embedding and output rows random, the tokenizer
unchanged), built under build/bench/, its output rows times ``--head-scale`` (default 1). At 1 its next-token
distributions are nearly flat: with top-p alone the nucleus is most of the vocabulary, so 0007 falls back to the sort
(the engine rows then measure that fallback's cost); a larger scale makes them peaked, as a trained model's are at a
usual temperature, and the nucleus narrow. Two engines run at once, one per arm (the stock wheel; the patched series with the flag), each in its own
process (tests/engines/vllm/probes/sampler_bench.py, the check's in-process engine: float32, eager), and take turns:
per repetition and batch size each decodes the same seeded sampled requests (``--tokens`` tokens each), the arm that
goes first alternating. Decode tok/s = batch x (decode steps) / seconds from the prefill step to the last step. Then
each arm times ``apply_top_k_top_p_pytorch`` alone (median of 30 calls per repetition, interleaved the same way) on
normal logits times each of ``--scales``: the larger the scale, the more peaked the distribution and the narrower
top-p's nucleus (reported as the tokens kept per row).

Ratios are patched / stock (engine tok/s) and stock / patched (function time) with 95 % paired log-ratio t-intervals
over the repetitions (overlay.check.stats.ratio_ci); an interval that spans 1.0 is not a speedup. The seeded tokens
must be equal in both arms. On this tiny model the sampler is most of a step; the milliseconds saved per step are
what carries over to a real model, whose forward adds its own time. Writes a JSON report (default
build/reports/vllm-sampler-bench-SAMPLING.json).
"""

from __future__ import annotations

import argparse
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
from overlay.check.stats import fmt_ratio, ratio_ci, speed_verdict
from overlay.fsutil import atomic_write_json
from overlay.paths import layout

PROBE = REPO / "tests" / "engines" / "vllm" / "probes" / "sampler_bench.py"
# what each sampling mode's patch is switched by: 0006 (top-k with top-p), 0007 (top-p alone), 0008 (penalties)
FLAGS = {
    "top-k-top-p": {"VLLM_OVL_TOPK_TOPP_PRESELECT": "1"},
    "top-p": {"VLLM_OVL_TOPP_NUCLEUS": "1"},
    "penalties": {"VLLM_OVL_SPARSE_PENALTIES": "1"},
    "spec": {"VLLM_OVL_RECOVER_AT_REJECTION": "1"},
}
# what both arms run with in a mode whose baseline is the series, not stock: sampled speculation needs 0009 (stock's
# engine dies on it) and 0006 takes the sort out of both arms, so the two differ by 0010's flag alone
BASELINE = {"spec": {"VLLM_OVL_TOPK_TOPP_PRESELECT": "1"}}
MARK = "@@sampler-bench "  # the probe's answer lines


def wide_model(vocab: int, head_scale: float) -> Path:
    """llama-random with ``vocab`` embedding and output rows (the first 512 are the model's own), the output rows times
    ``head_scale`` (its logits times it: the larger, the more peaked the next-token distribution)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    base = tinymodels.build("llama-random", root=REPO)
    out = layout(REPO).build / "bench" / f"{base.name}-vocab{vocab}-head{head_scale:g}"
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
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * np.float32(head_scale)
    save_file(tensors, str(out / "model.safetensors.tmp"))
    atomic_write_json(out / "config.json", config)
    os.replace(out / "model.safetensors.tmp", out / "model.safetensors")
    return out


class Engine:
    """One arm's engine process (the probe), answering one command per line."""

    def __init__(self, arm: Arm, model: Path, *extra: str) -> None:
        env = {**os.environ, **arm.env}
        env.pop("PYTHONHOME", None)
        self.name = arm.name
        self.proc = subprocess.Popen(
            [str(arm.python), str(PROBE), str(model), *extra],
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
    model = wide_model(args.vocab, args.head_scale)
    arms = arms_for(REPO, "vllm")
    flag = FLAGS[args.sampling]
    base = BASELINE.get(args.sampling)
    stock = arms.stock if base is None else arms.patched.with_env(base)
    patched = stock.with_env(flag) if base is not None else arms.patched.with_env(flag)
    extra = ("spec",) if args.sampling == "spec" else ()
    engines = {"stock": Engine(stock, model, *extra), "patched": Engine(patched, model, *extra)}
    batches = [int(b) for b in args.batches.split(",")]
    scales = [float(x) for x in args.scales.split(",")]
    tok_s: dict[str, dict[int, list[float]]] = {a: {b: [] for b in batches} for a in engines}
    fn_s: dict[str, dict[str, list[float]]] = {a: {} for a in engines}
    kept: dict[str, list[int]] = {}
    identical = True
    load = [os.getloadavg()[0]]
    try:
        for rep in range(args.reps):
            order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
            for b in batches:
                tokens: dict[str, Any] = {}
                for a in order:
                    r = engines[a].ask(
                        task="engine", mode=args.sampling, batch=b, tokens=args.tokens, seed=100 * rep
                    )
                    tok_s[a][b].append(r["decoded"] / r["seconds"])
                    tokens[a] = r["tokens"]
                if base is None:  # sampled speculation draws other random numbers with the flag
                    identical &= tokens["stock"] == tokens["patched"]
                for x in scales:
                    for a in order:
                        cmd = {"mode": args.sampling, "batch": b, "vocab": args.vocab, "scale": x, "reps": 30}
                        r = engines[a].ask(task="function", **cmd)
                        fn_s[a].setdefault(f"{b}/{x:g}", []).append(r["seconds"])
                        kept.setdefault(f"{b}/{x:g}", r["kept"])
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    finally:
        for e in engines.values():
            e.close()
    load.append(os.getloadavg()[0])
    rows = []
    for b in batches:
        speed = ratio_ci(tok_s["patched"][b], tok_s["stock"][b])
        # seconds per batch of b tokens (a decode step without speculation)
        stock_s, patched_s = (b / statistics.median(tok_s[a][b]) for a in ("stock", "patched"))
        rows.append(
            {
                "batch": b,
                "stock_tok_s": statistics.median(tok_s["stock"][b]),
                "patched_tok_s": statistics.median(tok_s["patched"][b]),
                "decode_ratio": speed,
                "decode_verdict": speed_verdict(speed, higher_is_better=True),
                "step_ms_saved": 1e3 * (stock_s - patched_s),
            }
        )
    functions = [
        {
            "batch": int(key.split("/")[0]),
            "scale": float(key.split("/")[1]),
            "kept_per_row": kept[key],  # the nucleus (top-p alone) or the top-p share of the top-k candidates
            "ms": {a: 1e3 * statistics.median(fn_s[a][key]) for a in engines},
            "speedup": ratio_ci(fn_s["stock"][key], fn_s["patched"][key]),  # stock time / patched time
        }
        for key in fn_s["stock"]
    ]
    return {
        "version": 1,
        "model": str(model.relative_to(REPO)),
        "vocab": args.vocab,
        "head_scale": args.head_scale,
        "sampling": args.sampling,
        "arms": {
            "stock": stock.version if base is None else f"{stock.version} with {base}",
            "patched": arms.patched.version,
            "flag": flag,
        },
        "reps": args.reps,
        "tokens": args.tokens,
        "threads": {a: e.ready.get("threads") for a, e in engines.items()},
        "load_average": load,
        # None where the arms draw other random numbers by design (spec)
        "identical_tokens": identical if base is None else None,
        "engine": rows,
        "function": functions,
        "samples": {"decode_tok_s": tok_s, "function_s": fn_s},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--sampling", choices=sorted(FLAGS), default="top-k-top-p")
    ap.add_argument(
        "--head-scale", type=float, default=1.0, help="the model's output rows times this (default 1)"
    )
    ap.add_argument(
        "--scales", default="3", help="the function's logits: normal times each scale (default 3)"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    report = run(args)
    out = args.json or layout(REPO).reports / f"vllm-sampler-bench-{args.sampling}.json"
    atomic_write_json(out, report)
    print(
        f"model {report['model']} (vocab {report['vocab']}), sampling {args.sampling}, {report['reps']} reps x "
        f"{report['tokens']} tokens, load {report['load_average'][0]:.2f} -> {report['load_average'][1]:.2f}, "
        f"seeded tokens identical: {'not compared' if report['identical_tokens'] is None else report['identical_tokens']}"
    )
    print("| batch | stock tok/s | patched tok/s | patched/stock [95 %] | ms saved per step |")
    print("|---:|---:|---:|---|---:|")
    for r in report["engine"]:
        print(
            f"| {r['batch']} | {r['stock_tok_s']:.1f} | {r['patched_tok_s']:.1f} | "
            f"{fmt_ratio(r['decode_ratio'], 2, 'x')} ({r['decode_verdict']}) | {r['step_ms_saved']:.2f} |"
        )
    print("| batch | logits scale | tokens kept per row | sampler ms, stock -> patched | speedup [95 %] |")
    print("|---:|---:|---|---|---|")
    for f in report["function"]:
        print(
            f"| {f['batch']} | {f['scale']:g} | {f['kept_per_row']} | {f['ms']['stock']:.2f} -> "
            f"{f['ms']['patched']:.2f} | {fmt_ratio(f['speedup'], 2, 'x')} |"
        )
    print(f"report: {out}")
    return 1 if report["identical_tokens"] is False else 0


if __name__ == "__main__":
    raise SystemExit(main())
