"""Probe: SpeculativeController with the shadow evidence of a drafter's catch-up, simulated (patched arm only).

Payload: {"scenarios": [{"id", "k_max", "tokens", "serial", "draft", "verify": [v0, v1], "alpha": [[from_token,
acceptance], ...], "noise", "seed", "shadow": bool, "catch_up": seconds per caught-up token}]}: the scenarios of
probes/spec_controller_sim.py, plus how the generator feeds the controller (``speculative_generate_step``): after a
serial run the drafter catches up on its tokens (``catch_up`` seconds each, paid whether or not a cycle follows) and,
with ``shadow``, the controller gets the acceptance of its drafts at the last 16 of them (``record_shadow``: a draw
per token with the acceptance of that moment) and drafts the cycle only if ``probe_pays()``. Without ``shadow``: the
generator of before (every serial run is followed by a cycle).

Result: {"scenarios": {id: {"speedup" (serial time / adaptive time, true costs), "best_fixed", "serial_share",
"cycles", "skipped" (checks answered by the evidence alone), "per_phase"}}}. Deterministic (seeded), nothing timed.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

from probe_io import emit, read_payload
from spec_controller_sim import _alpha_at

SHADOW = 16  # what the generator keeps: the target's view of the last 16 serial tokens


def simulate(sc: dict[str, Any]) -> dict[str, Any]:
    gen = importlib.import_module("mlx_lm.generate")
    ctrl = gen.SpeculativeController(sc["k_max"])
    rng = random.Random(sc.get("seed", 0))
    noise = sc.get("noise", 0.0)
    c_s: float
    c_d: float
    v0: float
    v1: float
    c_s, c_d = sc["serial"], sc["draft"]
    v0, v1 = sc["verify"]
    catch_up = sc.get("catch_up", 0.0)
    n, phases = sc["tokens"], sc["alpha"]
    emitted, spent, serial_tokens, cycles, skipped, unseen = 0, 0.0, 0, 0, 0, 0
    phase_time: dict[int, float] = {}
    phase_tokens: dict[int, int] = {}

    def measured(t: float) -> float:
        return t * (1.0 + abs(rng.gauss(0.0, noise)))

    def account(token: int, t: float, count: int) -> None:
        ph = max(i for i, (start, _) in enumerate(phases) if token >= start)
        phase_time[ph] = phase_time.get(ph, 0.0) + t
        phase_tokens[ph] = phase_tokens.get(ph, 0) + count

    while emitted < n:
        m = min(ctrl.serial_tokens(n - emitted), n - emitted)
        if m > 0:
            ctrl.record_serial([measured(c_s) for _ in range(max(m - 2, 0))])
            account(emitted, m * c_s, m)
            emitted += m
            spent += m * c_s
            serial_tokens += m
            unseen += m
            continue
        if unseen:
            # The drafter catches up before it drafts (as stock's generator does).
            spent += unseen * catch_up
            account(emitted, unseen * catch_up, 0)
            if sc.get("shadow"):
                seen = [
                    float(rng.random() < _alpha_at(phases, emitted - i))
                    for i in range(min(unseen, SHADOW), 0, -1)
                ]
                unseen = 0
                ctrl.record_shadow(seen)
                if not ctrl.probe_pays():
                    skipped += 1
                    continue
            unseen = 0
        k = min(ctrl.k, n - emitted)
        alpha = _alpha_at(phases, emitted)
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        t = k * c_d + v0 + v1 * k
        timed = ctrl.timing_cycle()
        ctrl.record_cycle(k, accepted, measured(t), measured(k * c_d) if timed else None)
        account(emitted, t, accepted + 1)
        emitted += accepted + 1
        spent += t
        cycles += 1

    def fixed(k: int, alpha: float) -> float:
        e = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
        return e * c_s / (k * c_d + v0 + v1 * k)

    mean_alpha = sum(_alpha_at(phases, t) for t in range(n)) / n
    return {
        "speedup": n * c_s / spent,
        "best_fixed": max(fixed(k, mean_alpha) for k in range(1, sc["k_max"] + 1)),
        "serial_share": serial_tokens / n,
        "cycles": cycles,
        "skipped": skipped,
        "per_phase": [phase_tokens[i] * c_s / phase_time[i] for i in sorted(phase_time)],
    }


if __name__ == "__main__":
    payload = read_payload()
    emit({"scenarios": {sc["id"]: simulate(sc) for sc in payload["scenarios"]}})
