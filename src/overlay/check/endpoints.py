"""`overlay check --endpoints STOCK_URL PATCHED_URL`: two running OpenAI-compatible servers (SGLang, vLLM,
mlx_lm.server), side by side.

1. Identity: each prompt once per server (temperature 0, a fixed seed, not streamed, log-probabilities asked for),
   the arms alternating which goes first: the outputs must be identical; where both return log-probabilities their
   agreement is reported (max |d| over the tokens both produced alike).
2. Load: ``requests`` streamed requests per arm, ``concurrency`` in flight at a time, in rounds that alternate the
   arms (stock round, patched round, then the other way round), within ``time_limit_s``: time to first token,
   inter-token latency (between streamed chunks: one token each on most servers; the token count comes from the
   usage the server reports) and output tok/s percentiles per arm, and a paired ratio per round (overlay.check.stats).

The requests go through overlay.check.endpoints_client (http.client; threads here for the load). The report (JSON and HTML) is written before a failing gate raises CheckFailed (exit 4).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlay.check import stats
from overlay.check.endpoints_client import SEED, Reply, Server, discover, request
from overlay.check.inputs import PromptSpec, load_prompts
from overlay.errors import UsageError
from overlay.progress import NullReporter, Reporter

REPORT_VERSION = 1
DEFAULT_PROMPTS = (
    PromptSpec(category="code", text="def fibonacci(n):\n    "),
    PromptSpec(category="prose", text="The history of the printing press begins"),
    PromptSpec(category="list", text="Three facts about the Moon:\n1."),
    PromptSpec(category="chat", messages=(("user", "Name three prime numbers."),)),
)


@dataclass(frozen=True)
class EndpointOptions:
    stock_url: str
    patched_url: str
    model: str | None = None
    prompts_file: Path | None = None
    concurrency: int = 4
    requests: int = 32
    max_tokens: int = 48
    time_limit_s: float = 600.0
    request_timeout_s: float = 120.0
    json_path: Path | None = None
    html_path: Path | None = None


def identity(
    servers: tuple[Server, Server], prompts: list[PromptSpec], options: EndpointOptions, reporter: Reporter
) -> dict[str, Any]:
    rows = []
    for i, prompt in enumerate(prompts):
        order = servers if i % 2 == 0 else servers[::-1]
        got: dict[str, Reply] = {}
        for s in order:
            r = request(
                s,
                prompt,
                max_tokens=options.max_tokens,
                stream=False,
                logprobs=True,
                timeout=options.request_timeout_s,
            )
            if not r.ok:  # a server that refuses logprobs: ask again without
                r = request(
                    s,
                    prompt,
                    max_tokens=options.max_tokens,
                    stream=False,
                    logprobs=False,
                    timeout=options.request_timeout_s,
                )
            got[s.arm] = r
        a, b = got["stock"], got["patched"]
        row: dict[str, Any] = {
            "prompt": i,
            "category": prompt.category,
            "identical": a.ok and b.ok and a.text == b.text,
            "stock_ok": a.ok,
            "patched_ok": b.ok,
            "error": a.error or b.error,
        }
        if a.ok and b.ok and a.text != b.text:
            k = next(
                (j for j, (x, y) in enumerate(zip(a.text, b.text)) if x != y), min(len(a.text), len(b.text))
            )
            row["first_difference_char"] = k
            row["stock_text"], row["patched_text"] = (
                a.text[max(0, k - 20) : k + 40],
                b.text[max(0, k - 20) : k + 40],
            )
        if a.logprobs and b.logprobs:
            same = 0
            for j, (x, y) in enumerate(zip(a.token_ids or [], b.token_ids or [])):
                if x != y:
                    break
                same = j + 1
            n = (
                min(same, len(a.logprobs), len(b.logprobs))
                if a.token_ids and b.token_ids
                else min(len(a.logprobs), len(b.logprobs))
            )
            row["logprob_positions"] = n
            row["logprob_max_abs_diff"] = max(
                (abs(x - y) for x, y in zip(a.logprobs[:n], b.logprobs[:n])), default=0.0
            )
        rows.append(row)
        reporter.step(
            "check",
            f"endpoints: identity: prompt {i + 1}/{len(prompts)} {'same' if row['identical'] else 'DIFFERS'}",
        )
    with_lp = [r for r in rows if "logprob_max_abs_diff" in r]
    return {
        "prompts": len(rows),
        "identical_count": sum(r["identical"] for r in rows),
        "identical": all(r["identical"] for r in rows),
        "rows": rows,
        "logprobs": {
            "returned_by_both": len(with_lp),
            "max_abs_diff": max((r["logprob_max_abs_diff"] for r in with_lp), default=None),
            "positions": sum(r["logprob_positions"] for r in with_lp),
        }
        if with_lp
        else None,
    }


def _pct(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None}
    v = sorted(values)

    def q(p: float) -> float:
        k = (len(v) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return v[lo] + (v[hi] - v[lo]) * (k - lo)

    return {"n": len(v), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "mean": sum(v) / len(v)}


def load(
    servers: tuple[Server, Server], prompts: list[PromptSpec], options: EndpointOptions, reporter: Reporter
) -> dict[str, Any]:
    """Rounds of ``concurrency`` streamed requests to one arm, alternating arms, until each arm sent ``requests``
    or the time limit passed (then both arms have sent the same number of rounds)."""
    replies: dict[str, list[Reply]] = {"stock": [], "patched": []}
    per_round: dict[str, list[float]] = {
        "stock_tok_s": [],
        "patched_tok_s": [],
        "stock_ttft": [],
        "patched_ttft": [],
    }
    rounds = math.ceil(options.requests / options.concurrency)
    deadline = time.monotonic() + options.time_limit_s
    done = 0
    stopped = False
    with ThreadPoolExecutor(max_workers=options.concurrency) as pool:
        for rnd in range(rounds):
            if time.monotonic() > deadline:
                stopped = True
                break
            n = min(options.concurrency, options.requests - rnd * options.concurrency)
            batch = [prompts[(rnd * options.concurrency + j) % len(prompts)] for j in range(n)]
            order = servers if rnd % 2 == 0 else servers[::-1]
            for s in order:
                got = list(
                    pool.map(
                        lambda p, s=s: request(
                            s,
                            p,
                            max_tokens=options.max_tokens,
                            stream=True,
                            logprobs=False,
                            timeout=options.request_timeout_s,
                        ),
                        batch,
                    )
                )
                replies[s.arm] += got
                rates = [r.tok_s for r in got if r.ok and r.tok_s]
                ttfts = [r.ttft_s for r in got if r.ok and r.ttft_s is not None]
                per_round[f"{s.arm}_tok_s"].append(_median(rates))
                per_round[f"{s.arm}_ttft"].append(_median(ttfts))
            done += 1
            reporter.step(
                "check", f"endpoints: load: round {rnd + 1}/{rounds} ({n} requests in flight per arm)"
            )
    arms: dict[str, Any] = {}
    for arm, rs in replies.items():
        ok = [r for r in rs if r.ok]
        arms[arm] = {
            "requests": len(rs),
            "failed": len(rs) - len(ok),
            "errors": sorted({r.error for r in rs if r.error})[:5],
            "ttft_s": _pct([r.ttft_s for r in ok if r.ttft_s is not None]),
            "itl_s": _pct([x for r in ok for x in r.itl_s]),
            "output_tok_s": _pct([r.tok_s for r in ok if r.tok_s]),
            "output_tokens": sum(r.tokens for r in ok),
        }
    pairs = [(p, s) for p, s in zip(per_round["patched_tok_s"], per_round["stock_tok_s"]) if p > 0 and s > 0]
    tpairs = [(p, s) for p, s in zip(per_round["patched_ttft"], per_round["stock_ttft"]) if p > 0 and s > 0]
    ratio: dict[str, Any] = {}
    for name, pr, higher in (("output_tok_s", pairs, True), ("ttft", tpairs, False)):
        if pr:
            r = stats.ratio_ci([p for p, _ in pr], [s for _, s in pr])
            r.update(
                better="higher" if higher else "lower",
                verdict=stats.speed_verdict(r, higher_is_better=higher),
                paired_by="round (median of the round's requests)",
            )
            ratio[name] = r
    return {
        "concurrency": options.concurrency,
        "requests_per_arm": options.requests,
        "rounds": done,
        "stopped_by_time_limit": stopped,
        "time_limit_s": options.time_limit_s,
        "max_tokens": options.max_tokens,
        "arms": arms,
        "ratio": ratio,
    }


def _median(values: list[float]) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def run_endpoints(
    *, root: Path, options: EndpointOptions, reporter: Reporter | None = None
) -> dict[str, Any]:
    reporter = reporter or NullReporter()
    if options.concurrency < 1 or options.concurrency > 256:
        raise UsageError(f"--concurrency {options.concurrency} must be within 1..256")
    if options.requests < 1:
        raise UsageError(f"--requests {options.requests} must be at least 1")
    if options.max_tokens < 1:
        raise UsageError(f"--max-tokens {options.max_tokens} must be at least 1")
    if not options.time_limit_s > 0:
        raise UsageError(f"--time-limit {options.time_limit_s:g} must be above 0")
    prompts = load_prompts(options.prompts_file) if options.prompts_file else list(DEFAULT_PROMPTS)
    servers = (
        discover("stock", options.stock_url, options.model, "STOCK_URL"),
        discover("patched", options.patched_url, options.model, "PATCHED_URL"),
    )
    from overlay.check.host import host_facts

    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "mode": "endpoints",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": host_facts(),
        "servers": {s.arm: {"url": s.base, "model": s.model} for s in servers},
        "prompts": {
            "source": str(options.prompts_file) if options.prompts_file else "built-in",
            "count": len(prompts),
        },
        "notes": [],
    }
    reporter.step("check", f"endpoints: identity: {len(prompts)} prompts, temperature 0, seed {SEED}")
    report["identity"] = identity(servers, prompts, options, reporter)
    reporter.step(
        "check", f"endpoints: load: {options.requests} requests per arm, {options.concurrency} in flight"
    )
    report["load"] = load(servers, prompts, options, reporter)
    if report["load"]["stopped_by_time_limit"]:
        report["notes"].append(
            f"load phase stopped by --time-limit {options.time_limit_s:g}s after "
            f"{report['load']['rounds']} rounds"
        )
    if report["identity"]["logprobs"] is None:
        report["notes"].append("log-probabilities: not returned by both servers; agreement not measured")
    ident = report["identity"]
    gates = [
        {
            "subject": "endpoints",
            "class": "greedy",
            "gate": "greedy output identical per prompt",
            "passed": ident["identical"],
            "detail": f"{ident['identical_count']}/{ident['prompts']} prompts",
        }
    ]
    failed = {a: v["failed"] for a, v in report["load"]["arms"].items()}
    gates.append(
        {
            "subject": "endpoints",
            "class": "load",
            "gate": "every load request answered",
            "passed": not any(failed.values()),
            "detail": ", ".join(f"{a}: {n} failed" for a, n in failed.items()),
        }
    )
    from overlay.check.endpoints_report import finish

    return finish(root, options, report, gates)
