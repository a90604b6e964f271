"""The mlx-lm mechanism census (``overlay check --mechanism``): one scenario (decode-token, prefill-chunk,
spec-verify-step, draft-round) run through mlx-lm's real call path (generate_step, speculative_generate_step) under the
hooks of mlx_census_hooks.py, counted per step. Runs inside an mlx-lm arm (task ``census`` of mlx_lm_worker.py); not
imported by overlay itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx_lm_options as options
from mlx_census_hooks import Census

if TYPE_CHECKING:
    from overlay.schemas.documents import CensusRequest

DRAFT_ROUND_PROMPT = 288  # prompt tokens of draft-round (spec-verify-step: 8)


def _diff(a: dict[str, Any], b: dict[str, Any], steps: int, phase: str) -> dict[str, Any]:
    """Per-step counts of ``phase`` between two snapshots."""

    def per(key: str) -> float:
        count: float = (b[key][phase] - a[key][phase]) / steps
        return count

    def sites(key: str, top: int = 12) -> list[list[Any]]:
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


def _census_result(
    scenario: str, steps: int, d: dict[str, Any], compiled_fast: float, notes: list[str]
) -> dict[str, Any]:
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


def task_census(req: CensusRequest) -> dict[str, Any]:
    import mlx.core as mx

    census = Census(mx)
    census.install()  # before mlx_lm is imported: its module-level mx.compile decorators go through the hook
    from mlx_lm import load
    from mlx_lm.generate import generate_step, speculative_generate_step

    scenario, steps = req["scenario"], int(req["steps"])
    opts = {options.keyword(k): options.value(v) for k, v in (req.get("options") or {}).items()}
    if req.get("sampler"):
        from mlx_lm.sample_utils import make_sampler

        mx.random.seed(0)
        opts["sampler"] = make_sampler(**req["sampler"])
    mtp = opts.get("draft_kind") == "mtp"
    # `--draft-kind mtp` loads the model with its MTP head, as mlx_lm.generate and the server do
    model, tok = load(req["model"], model_config={"keep_mtp": True} if mtp else None)
    census.tag_model(model, "verify" if scenario in ("spec-verify-step", "draft-round") else "main")
    base = tok.encode(
        req.get("prompt_text") or "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
    )
    notes: list[str] = [
        f"sampler: make_sampler({req['sampler']})"
        if req.get("sampler")
        else "sampler: generate_step's default (greedy_sampler), the path of `mlx_lm.generate` at temp 0"
    ]

    def prompt_of(n: int) -> Any:
        ids = (base * (n // max(len(base), 1) + 1))[:n]
        return mx.array(ids)

    if scenario == "decode-token":
        n_prompt = int(req.get("prompt_tokens", 8))
        prompt = prompt_of(n_prompt)
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
            f"{steps} steady-state tokens (between the 2nd and the {steps + 2}th yield), prompt {n_prompt} tokens; "
            f"{cf / steps:g} model forwards per token"
        )
        return _census_result(
            scenario, steps, d, _compiled_fast(census, marks[1], marks[steps + 1], steps, "main"), notes
        )
    if scenario == "prefill-chunk":
        chunk = int(req.get("chunk", 16))

        def to_first(n: int) -> dict[str, Any]:
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
        for key in ("eval_sites", "op_sites", "prims", "moved_sites", "peak"):
            d[key] = d_long[key]
        notes.append(
            f"per chunk of {chunk} tokens: (prompt of {steps}x{chunk}+1 tokens) - (prompt of 1 token), "
            "counted up to the first token; sites are those of the long prompt, per chunk; peak-memory: "
            "the long prompt's"
        )
        return _census_result(scenario, steps, d, 0.0, notes)
    if scenario in ("spec-verify-step", "draft-round"):
        k = int(req.get("num_draft", 3))
        if mtp:  # the model's own head drafts (no draft model); its forwards are the draft phase
            from mlx_lm.models.mtp import has_mtp, mtp_owner

            draft = None
            if has_mtp(model):  # without one, speculative_generate_step says so
                census.tag_model(mtp_owner(model).mtp, "draft")
        else:
            draft, _ = load(req.get("draft") or req["model"])
            census.tag_model(draft, "draft")
        # a draft round runs past a bounded draft cache's window (--draft-max-kv-size 64 holds 64 + slack slots) and
        # past mlx-lm's first 256-slot KVCache block, so a bound on the drafter's cache shows in peak-memory
        n_prompt = int(req.get("prompt_tokens", DRAFT_ROUND_PROMPT if scenario == "draft-round" else 8))
        prompt = prompt_of(n_prompt)
        max_tokens = (steps + 3) * (k + 1)

        def run_spec() -> list[dict[str, Any]]:
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
            f"{drafter_text(req, mtp)}; "
            f"{drafts:g} draft forwards per round; phase '{phase}' = the events after that model's forward"
        )
        return _census_result(scenario, steps, d, _compiled_fast(census, a, b, steps, phase), notes)
    raise ValueError(f"census: unknown scenario {scenario!r}")


def drafter_text(req: CensusRequest, mtp: bool) -> str:
    if mtp:
        return "the model's own MTP head (--draft-kind mtp)"
    return "self-draft (the target loaded twice)" if not req.get("draft") else "drafter " + req["draft"]


def _compiled_fast(census: Census, a: dict[str, Any], b: dict[str, Any], steps: int, phase: str) -> float:
    calls: float = (b["compiled_fast"][phase] - a["compiled_fast"][phase]) / max(steps, 1)
    return calls
