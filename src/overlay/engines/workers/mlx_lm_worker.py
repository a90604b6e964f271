"""Runs inside an mlx-lm arm (stock or patched venv) for `overlay check`. Not imported by overlay itself.

Protocol: one JSON request on stdin, one JSON document on stdout. Uses only mlx-lm's public API, so the same script
measures the stock and the patched engine. Tasks: tokenize, greedy, logits, speed, spec, cold, census.
"""

from __future__ import annotations

import json
import sys
import time

T_START = time.time()

import numpy as np  # noqa: E402


def _load(path: str):
    from mlx_lm import load

    return load(path)


def _argmax_sampler(mx):
    return lambda logprobs: mx.argmax(logprobs, axis=-1)


def task_tokenize(req: dict) -> dict:
    _model, tok = _load(req["model"])
    return {"ids": [tok.encode(p) for p in req["prompts"]], "vocab_size": len(tok.get_vocab())}


def task_greedy(req: dict) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model, _tok = _load(req["model"])
    outputs, margins, files = [], [], []
    for i, ids in enumerate(req["prompts"]):
        toks, marg, rows = [], [], []
        for tok, logprobs in generate_step(
            mx.array(ids), model, max_tokens=req["max_tokens"], sampler=_argmax_sampler(mx)
        ):
            lp = np.array(logprobs.astype(mx.float32))
            top2 = np.partition(lp, -2)[-2:]
            toks.append(int(tok))
            marg.append(float(top2.max() - top2.min()))
            rows.append(lp)
        outputs.append(toks)
        margins.append(marg)
        if req.get("out"):
            path = f"{req['out']}/greedy_{i}.npy"
            np.save(path, np.stack(rows).astype(np.float32))
            files.append(path)
    return {"outputs": outputs, "margins": margins, "files": files}


def task_logits(req: dict) -> dict:
    import mlx.core as mx

    model, _tok = _load(req["model"])
    files = []
    for i, ids in enumerate(req["sequences"]):
        logits = model(mx.array(ids[:-1])[None])[0].astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        path = f"{req['out']}/logits_{i}.npy"
        np.save(path, np.array(logprobs))
        files.append(path)
    return {"files": files}


def task_speed(req: dict) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model, _tok = _load(req["model"])
    prompt = mx.array(req["prompt"])
    n = req["decode_tokens"]

    def run() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        t_first = None
        c_first = 0.0
        count = 0
        for _tok, _lp in generate_step(prompt, model, max_tokens=n, sampler=_argmax_sampler(mx)):
            count += 1
            if t_first is None:
                t_first = time.perf_counter()
                c_first = time.process_time()
        t_end = time.perf_counter()
        c_end = time.process_time()
        assert t_first is not None
        return (
            len(req["prompt"]) / (t_first - t0),
            (count - 1) / max(t_end - t_first, 1e-9),
            (count - 1) / max(c_end - c_first, 1e-9),
        )

    run()  # warm-up: compilation, caches
    samples = [run() for _ in range(req.get("inner_reps", 3))]
    med = [float(np.median([s[i] for s in samples])) for i in range(3)]
    return {"prefill_tok_s": med[0], "decode_tok_s": med[1], "decode_cpu_tok_s": med[2]}


def task_spec(req: dict) -> dict:
    """Speculative greedy decoding, once per draft in ``drafts`` (label -> draft model folder, or "mtp": the model
    drafts with its own MTP head, patched mlx-lm only, loaded with keep_mtp). ``adaptive_draft``: the patched
    adaptive controller."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate

    uses_mtp = "mtp" in req["drafts"].values()
    model, tok = load(req["model"], model_config={"keep_mtp": True}) if uses_mtp else _load(req["model"])
    extra = {"adaptive_draft": True} if req.get("adaptive_draft") else {}
    drafts: dict = {}
    for label, path in req["drafts"].items():
        if path == "mtp":
            draft, kind = None, {"draft_kind": "mtp"}
        else:
            draft, kind = _load(path)[0], {}
        results = []
        for ids in req["prompts"]:
            tokens, flags = [], []
            stats = None
            for resp in stream_generate(
                model,
                tok,
                mx.array(ids),
                max_tokens=req["max_tokens"],
                draft_model=draft,
                num_draft_tokens=req["k"],
                sampler=_argmax_sampler(mx),
                **extra,
                **kind,
            ):
                tokens.append(int(resp.token))
                flags.append(bool(getattr(resp, "from_draft", False)))
                stats = getattr(resp, "spec_stats", None) or stats
            results.append(
                {"tokens": tokens, "from_draft": flags, "stats": stats if isinstance(stats, dict) else None}
            )
        drafts[label] = {"results": results}
    return {"drafts": drafts}


def task_cold(req: dict) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    t_import = time.time()
    model, _tok = _load(req["model"])
    t_loaded = time.time()
    next(iter(generate_step(mx.array(req["prompt"]), model, max_tokens=1, sampler=_argmax_sampler(mx))))
    return {"t_start": T_START, "t_import": t_import, "t_loaded": t_loaded, "t_first_token": time.time()}


# ------------------------------------------------------------------ census (overlay check --mechanism)
#
# Counted in mlx-lm's real call path (generate_step, speculative_generate_step), on hooks installed before mlx_lm is
# imported:
# - ops: every mx.eval / mx.async_eval, and every array.item / tolist / __bool__ / __int__ / __float__ (an implicit
#   eval), first writes the graph it is about to materialise with mx.export_to_dot (mlx's own graph export: the
#   unevaluated primitives reachable from the arrays; evaluated arrays are leaves) and counts its primitive nodes.
# - evals: the number of those calls, by call site (file:line and kind); host-syncs: the blocking ones (all but
#   mx.async_eval).
# - Metal: on the CPU backend mlx runs mx.fast.rms_norm / layer_norm / rope / scaled_dot_product_attention as their
#   fallback graphs (many primitives); a Metal build runs each as one kernel. The hooks on mx.fast record which
#   primitive ids each call created, so a graph's count also gives a Metal estimate (fallback primitives collapsed to
#   one per call). mx.compile fuses elementwise primitives on both backends, but it cannot fuse across a Metal fast
#   kernel: the fast calls made while a compiled function was traced are added back, once per call, to the estimate.

#
# Memory, from mlx's own allocator counters (mx.get_active_memory / get_peak_memory / reset_peak_memory; mx.metal.* on
# older mlx), which the CPU backend keeps as the Metal one does (bytes of live buffers, the allocator's free-buffer
# cache excluded):
# - bytes-moved: every counted evaluation is run to completion inside its hook (an mx.async_eval is waited for there:
#   still counted as async, its work just no longer overlaps the next graph's construction), with the peak counter
#   reset before it; its bytes are (peak during it) - (active before it): the new buffers it held at its high-water
#   mark, outputs included. Per step: the sum over the step's evaluations. The export_to_dot graph carries no shapes,
#   hence the allocator. Blind spots: reads (a matmul's weights are not counted), a buffer donated to an elementwise
#   op and written in place (counted once), an intermediate freed before the high-water mark, views (reshape, slice,
#   transpose without a copy: 0 bytes), allocations outside counted evaluations.
# - peak-memory: the allocator's high-water mark over the census steps (bytes, a level: weights, caches and the
#   steps' transients together, both models of a speculative run), not a per-step sum.

_FAST = ("rms_norm", "layer_norm", "rope", "scaled_dot_product_attention")
DRAFT_ROUND_PROMPT = 288  # prompt tokens of draft-round (spec-verify-step: 8)


class _Memory:
    """mlx's allocator counters: the window peak kept across the per-evaluation peak resets of bytes-moved."""

    def __init__(self, mx) -> None:
        api = mx if hasattr(mx, "get_peak_memory") else mx.metal
        self.active, self.peak_now, self.reset_peak = (
            api.get_active_memory,
            api.get_peak_memory,
            api.reset_peak_memory,
        )
        self.high = 0
        self.intervals: list[int] = []  # the high-water mark between consecutive snapshots

    def fold(self) -> None:
        self.high = max(self.high, self.peak_now(), self.active())

    def restart(self) -> None:
        self.intervals = []
        self.reset_peak()
        self.high = self.active()

    def begin(self) -> int:
        self.fold()
        self.reset_peak()
        return self.active()

    def end(self, start: int) -> int:
        peak = max(self.peak_now(), self.active())
        self.high = max(self.high, peak)
        return max(peak - start, 0)

    def peak(self) -> list[int]:
        """Closes the interval since the previous snapshot; the intervals so far (a snapshot keeps its own copy)."""
        self.fold()
        self.intervals.append(self.high)
        self.reset_peak()
        self.high = self.active()
        return list(self.intervals)


_NODE = None  # compiled regex, set on first use


class _Census:
    def __init__(self, mx) -> None:
        import re
        from collections import Counter

        global _NODE
        _NODE = re.compile(r'\{ (\d+) \[label ="([^"]*)", shape=rectangle\]; \}')
        self.mx = mx
        self.Counter = Counter
        self.mem = _Memory(mx)
        self.streams: list = []
        self.phase = "main"
        self.tracing = 0
        self.fast_ids: dict[int, tuple[str, int]] = {}  # primitive id -> (label, fast call number)
        self.fast_calls = 0
        self.calls: Counter = Counter()  # model forwards by phase
        self.fast_log: list[str] = []
        self.reset()

    def reset(self) -> None:
        C = self.Counter
        self.ops, self.metal, self.fallback, self.evals, self.syncs = C(), C(), C(), C(), C()
        self.moved = C()  # bytes-moved: per phase, the sum over evaluations of their allocation high-water
        self.mem.restart()
        self.compiled_fast = C()  # fast calls inside compiled functions (Metal runs each as its own kernel)
        self.eval_sites: dict[str, C] = {}
        self.op_sites: dict[str, C] = {}
        self.prims: dict[str, C] = {}
        self.moved_sites: dict[str, C] = {}

    def snapshot(self) -> dict:
        import copy

        return copy.deepcopy(
            {
                k: getattr(self, k)
                for k in (
                    "ops",
                    "metal",
                    "fallback",
                    "evals",
                    "syncs",
                    "eval_sites",
                    "op_sites",
                    "prims",
                    "calls",
                    "compiled_fast",
                    "moved",
                    "moved_sites",
                )
            }
        ) | {"peak": self.mem.peak()}

    # graph walking -------------------------------------------------
    def graph(self, arrays: list) -> list[tuple[int, str]]:
        import io

        arrays = [a for a in arrays if isinstance(a, self.mx.array)]
        if not arrays or self.tracing:
            return []
        buf = io.StringIO()
        self.mx.export_to_dot(buf, *arrays)
        return [(int(i), name) for i, name in _NODE.findall(buf.getvalue())]

    def flatten(self, tree) -> list:
        out: list = []
        stack = [tree]
        while stack:
            t = stack.pop()
            if isinstance(t, (list, tuple)):
                stack.extend(t)
            elif isinstance(t, dict):
                stack.extend(t.values())
            elif isinstance(t, self.mx.array):
                out.append(t)
        return out

    def materialise(self, kind: str, arrays: list, depth: int = 2) -> str | None:
        """Counts one evaluation; returns its site (None while a compiled function is traced)."""
        if self.tracing:
            return None
        import sys

        f = sys._getframe(depth)
        site = f"{_short(f.f_code.co_filename)}:{f.f_lineno}"
        nodes = self.graph(arrays)
        groups = set()
        fallback = 0
        for pid, name in nodes:
            hit = self.fast_ids.pop(pid, None)
            if hit is not None and hit[0] == name:
                fallback += 1
                groups.add(hit[1])
        ph = self.phase
        self.ops[ph] += len(nodes)
        self.fallback[ph] += fallback
        self.metal[ph] += len(nodes) - fallback + len(groups)
        self.evals[ph] += 1
        if kind != "async_eval":
            self.syncs[ph] += 1
        self.eval_sites.setdefault(ph, self.Counter())[f"{site} {kind}"] += 1
        if nodes:
            self.op_sites.setdefault(ph, self.Counter())[site] += len(nodes)
            self.prims.setdefault(ph, self.Counter()).update(name for _, name in nodes)
        return site

    def settle(self) -> None:
        """Waits for every stream (mlx-lm's generation stream included), so the buffers their finished tasks
        release are released before the allocator is read."""
        for stream in (*self.streams, None):
            self.mx.synchronize(stream)

    def evaluate(self, site: str | None, run, *args):
        """Runs one counted evaluation to completion and adds the bytes it allocated to ``bytes-moved``."""
        if site is None:
            return run(*args)
        ph = self.phase
        self.settle()
        start = self.mem.begin()
        out = run(*args)
        self.settle()
        moved = self.mem.end(start)
        self.moved[ph] += moved
        if moved:
            self.moved_sites.setdefault(ph, self.Counter())[site] += moved
        return out

    # hooks -------------------------------------------------------------
    def install(self) -> None:
        mx = self.mx
        census = self
        real_eval, real_async = mx.eval, mx.async_eval

        def eval_(*args):
            site = census.materialise("eval", census.flatten(args))
            return census.evaluate(site, real_eval, *args)

        def async_eval_(*args):
            site = census.materialise("async_eval", census.flatten(args))

            def run_async(
                *a,
            ):  # waited for here, so its allocations are its own (counted as async all the same)
                real_async(*a)
                real_eval(*a)

            return census.evaluate(site, run_async, *args)

        mx.eval, mx.async_eval = eval_, async_eval_
        for maker in ("new_stream", "new_thread_local_stream"):
            real_maker = getattr(mx, maker, None)
            if real_maker is not None:

                def made(*a, _real=real_maker, **k):
                    stream = _real(*a, **k)
                    census.streams.append(stream)
                    return stream

                setattr(mx, maker, made)
        for meth in ("item", "tolist", "__bool__", "__int__", "__float__"):
            real = getattr(mx.array, meth)

            def hooked(self_, *a, _real=real, _kind=meth.strip("_"), **k):  # noqa: B008 (bound per method)
                site = census.materialise(_kind, [self_])
                return census.evaluate(site, lambda: _real(self_, *a, **k))

            setattr(mx.array, meth, hooked)
        for name in _FAST:
            real_fast = getattr(mx.fast, name, None)
            if real_fast is not None:
                setattr(mx.fast, name, self._fast(name, real_fast))
        real_compile = mx.compile

        def compile_(fun, *a, **k):
            fast_in_trace: list[list[str]] = [[]]

            def traced(*args, **kw):
                census.tracing += 1
                before = census.fast_log
                census.fast_log = []
                try:
                    return fun(*args, **kw)
                finally:
                    fast_in_trace[0] = census.fast_log
                    census.fast_log = before
                    census.tracing -= 1

            compiled = real_compile(traced, *a, **k)

            class Call:  # an instance, not a function: like mx.compile's result it does not bind as a method
                def __call__(self, *args, **kw):
                    out = compiled(*args, **kw)
                    if not census.tracing:
                        census.metal[census.phase] += len(fast_in_trace[0])
                        census.compiled_fast[census.phase] += len(fast_in_trace[0])
                    return out

            return Call()

        mx.compile = compile_

    def _fast(self, name, real):
        census = self

        def fast(*args, **kw):
            if census.tracing:
                census.fast_log.append(name)
                return real(*args, **kw)
            before = {pid for pid, _ in census.graph(census.flatten(list(args) + list(kw.values())))}
            out = real(*args, **kw)
            census.fast_calls += 1
            for pid, label in census.graph(census.flatten(out)):
                if pid not in before:
                    census.fast_ids[pid] = (label, census.fast_calls)
            return out

        return fast

    def tag_model(self, model, phase: str):
        """Forward calls of ``model`` switch the census phase (target: verify; drafter: draft)."""
        census = self
        cls = type(model)

        def __call__(self_, *a, **k):
            census.phase = phase
            census.calls[phase] += 1
            return cls.__call__(self_, *a, **k)

        model.__class__ = type(cls.__name__, (cls,), {"__call__": __call__})
        return model


def _option(value):
    """A CLI-style flag's value as the keyword argument generate_step takes: no value is True; numbers are numbers."""
    if value is None:
        return True
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def _short(path: str) -> str:
    marker = "site-packages/"
    return path.split(marker, 1)[1] if marker in path else path.rsplit("/", 1)[-1]


def _diff(a: dict, b: dict, steps: int, phase: str) -> dict:
    """Per-step counts of ``phase`` between two snapshots."""

    def per(key):
        return (b[key][phase] - a[key][phase]) / steps

    def sites(key, top=12):
        old = a[key].get(phase, {})
        new = b[key].get(phase, {})
        moved = {s: (new.get(s, 0) - old.get(s, 0)) / steps for s in set(new) | set(old)}
        return [[s, round(v, 4)] for s, v in sorted(moved.items(), key=lambda kv: (-kv[1], kv[0]))[:top] if v]

    window = b["peak"][len(a["peak"]) :]  # the intervals after snapshot a, up to and including b
    return {
        "ops": per("ops"),
        "metal": per("metal"),
        "fallback": per("fallback"),
        "evals": per("evals"),
        "syncs": per("syncs"),
        "moved": per("moved"),
        "peak": max(window) if window else None,
        "eval_sites": sites("eval_sites"),
        "op_sites": sites("op_sites"),
        "moved_sites": sites("moved_sites"),
        "prims": sites("prims", 80),
    }


def _census_result(scenario: str, steps: int, d: dict, compiled_fast: float, notes: list) -> dict:
    metrics = {
        "ops-per-token": d["ops"],
        "evals-per-token": d["evals"],
        "host-syncs": d["syncs"],
        "bytes-moved": d["moved"],
        "peak-memory": d["peak"],
    }
    return {
        "scenario": scenario,
        "steps": steps,
        "metrics": metrics,
        "sites": {
            "ops-per-token": d["op_sites"],
            "evals-per-token": d["eval_sites"],
            "host-syncs": [s for s in d["eval_sites"] if not s[0].endswith(" async_eval")],
            "bytes-moved": d["moved_sites"],
        },
        "detail": {
            "metal-ops-per-token": d["metal"],
            "fast-fallback-ops-per-token": d["fallback"],
            "compiled-fast-calls-per-token": compiled_fast,
            "primitives": d["prims"],
        },
        "notes": notes,
        "standin": None,
    }


def task_census(req: dict) -> dict:
    import mlx.core as mx

    census = _Census(mx)
    census.install()  # before mlx_lm is imported: its module-level mx.compile decorators go through the hook
    from mlx_lm import load
    from mlx_lm.generate import generate_step, speculative_generate_step

    scenario, steps = req["scenario"], int(req["steps"])
    opts = {k.lstrip("-").replace("-", "_"): _option(v) for k, v in (req.get("options") or {}).items()}
    if req.get("sampler"):
        from mlx_lm.sample_utils import make_sampler

        mx.random.seed(0)
        opts["sampler"] = make_sampler(**req["sampler"])
    model, tok = load(req["model"])
    census.tag_model(model, "verify" if scenario in ("spec-verify-step", "draft-round") else "main")
    base = tok.encode(
        req.get("prompt_text") or "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
    )
    notes: list = [
        f"sampler: make_sampler({req['sampler']})"
        if req.get("sampler")
        else "sampler: generate_step's default (greedy_sampler), the path of `mlx_lm.generate` at temp 0"
    ]

    def prompt_of(n: int):
        ids = (base * (n // max(len(base), 1) + 1))[:n]
        return mx.array(ids)

    if scenario == "decode-token":
        prompt = prompt_of(8)
        for _ in generate_step(
            prompt, model, max_tokens=steps + 2, **opts
        ):  # warm-up: compile traces, caches
            pass
        census.reset()
        marks = []
        for _ in generate_step(prompt, model, max_tokens=steps + 2, **opts):
            marks.append(census.snapshot())
        d = _diff(marks[1], marks[steps + 1], steps, "main")
        cf = marks[steps + 1]["calls"]["main"] - marks[1]["calls"]["main"]
        notes.append(
            f"{steps} steady-state tokens (between the 2nd and the {steps + 2}th yield), prompt 8 tokens; "
            f"{cf / steps:g} model forwards per token"
        )
        return _census_result(
            scenario, steps, d, _compiled_fast(census, marks[1], marks[steps + 1], steps, "main"), notes
        )
    if scenario == "prefill-chunk":
        chunk = int(req.get("chunk", 16))

        def to_first(n: int) -> dict:
            census.reset()
            start = census.snapshot()
            for _ in generate_step(prompt_of(n), model, max_tokens=1, prefill_step_size=chunk, **opts):
                break
            end = census.snapshot()
            return {"a": start, "b": end}

        to_first(steps * chunk + 1)  # warm-up
        long, short = to_first(steps * chunk + 1), to_first(1)
        d_long = _diff(long["a"], long["b"], steps, "main")
        d_short = _diff(short["a"], short["b"], steps, "main")
        d = {k: d_long[k] - d_short[k] for k in ("ops", "metal", "fallback", "evals", "syncs", "moved")}
        for k in ("eval_sites", "op_sites", "prims", "moved_sites", "peak"):
            d[k] = d_long[k]
        notes.append(
            f"per chunk of {chunk} tokens: (prompt of {steps}x{chunk}+1 tokens) - (prompt of 1 token), "
            "counted up to the first token; sites are those of the long prompt, per chunk; peak-memory: "
            "the long prompt's"
        )
        return _census_result(scenario, steps, d, 0.0, notes)
    if scenario in ("spec-verify-step", "draft-round"):
        k = int(req.get("num_draft", 3))
        draft, _ = load(req.get("draft") or req["model"])
        census.tag_model(draft, "draft")
        # a draft round runs past a bounded draft cache's window (--draft-max-kv-size 64 holds 64 + slack slots) and
        # past mlx-lm's first 256-slot KVCache block, so a bound on the drafter's cache shows in peak-memory
        n_prompt = int(req.get("prompt_tokens", DRAFT_ROUND_PROMPT if scenario == "draft-round" else 8))
        prompt = prompt_of(n_prompt)
        max_tokens = (steps + 3) * (k + 1)

        def run_spec() -> list:
            marks, last = [], -1
            gen = speculative_generate_step(
                prompt, model, draft, num_draft_tokens=k, max_tokens=max_tokens, **opts
            )
            for _ in gen:
                if census.calls["verify"] != last:  # the first token of a verify round
                    last = census.calls["verify"]
                    marks.append(census.snapshot())
            return marks

        run_spec()  # warm-up
        census.reset()
        census.calls.clear()
        marks = run_spec()
        if len(marks) < steps + 2:
            raise RuntimeError(f"speculative run gave {len(marks)} verify rounds, need {steps + 2}")
        a, b = marks[1], marks[steps + 1]
        phase = "verify" if scenario == "spec-verify-step" else "draft"
        d = _diff(a, b, steps, phase)
        drafts = (b["calls"]["draft"] - a["calls"]["draft"]) / steps
        notes.append(
            f"{steps} rounds (the 2nd to the {steps + 1}th verify), k={k}, prompt {n_prompt} tokens, "
            f"{'self-draft (the target loaded twice)' if not req.get('draft') else 'drafter ' + req['draft']}; "
            f"{drafts:g} draft forwards per round; phase '{phase}' = the events after that model's forward"
        )
        return _census_result(scenario, steps, d, _compiled_fast(census, a, b, steps, phase), notes)
    raise ValueError(f"census: unknown scenario {scenario!r}")


def _compiled_fast(census: _Census, a: dict, b: dict, steps: int, phase: str) -> float:
    return (b["compiled_fast"][phase] - a["compiled_fast"][phase]) / max(steps, 1)


TASKS = {name[5:]: fn for name, fn in globals().items() if name.startswith("task_")}


def main() -> None:
    req = json.loads(sys.stdin.read())
    result = TASKS[req["task"]](req)
    result["engine_version"] = __import__("mlx_lm").__version__
    print(json.dumps(result))


if __name__ == "__main__":
    main()
