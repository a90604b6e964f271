"""Probe: drive mlx-lm's SpeculativeController with simulated costs and acceptance (patched arm only).

Payload: {"scenarios": [{"id", "k_max", "tokens", "serial": seconds per serial token, "draft": seconds per draft
step, "verify": [v0, v1] (verify of k drafts: v0 + v1 k), "alpha": [[from_token, acceptance], ...] (per drafted
position, changes at the given tokens), "noise": multiplicative noise of measured times (only ever adds time),
"spikes": {cycle number: factor} (optional: those cycles, counted from 0, take factor times as long, true cost
included, as when other load stalls the machine for one cycle), "seed"}]}.
Result: {"scenarios": {id: {"speedup": serial time / adaptive time (true costs), "best_fixed": the best fixed-k
speedup under the same acceptance, "serial_share": tokens from serial steps / tokens, "cycles", "k_cycles",
"per_phase": [speedup of each alpha phase]}}}. Deterministic (seeded); no model runs, no timing of this machine.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

from probe_io import emit, read_payload


def _alpha_at(phases: list[list[float]], token: int) -> float:
    a = phases[0][1]
    for start, value in phases:
        if token >= start:
            a = value
    return a


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
    n = sc["tokens"]
    phases = sc["alpha"]
    spikes = {int(c): float(f) for c, f in sc.get("spikes", {}).items()}
    emitted, spent, serial_tokens, cycles = 0, 0.0, 0, 0
    k_cycles: dict[int, int] = {}
    phase_time: dict[int, float] = {}
    phase_tokens: dict[int, int] = {}

    def measured(t: float) -> float:
        return t * (1.0 + abs(rng.gauss(0.0, noise)))

    def account(token: int, t: float, count: int) -> None:
        ph = max(i for i, (start, _) in enumerate(phases) if token >= start)
        phase_time[ph] = phase_time.get(ph, 0.0) + t
        phase_tokens[ph] = phase_tokens.get(ph, 0) + count

    while emitted < n:
        m = min(ctrl.serial_tokens(), n - emitted)
        if m > 0:
            ctrl.record_serial([measured(c_s) for _ in range(max(m - 2, 0))])
            account(emitted, m * c_s, m)
            emitted += m
            spent += m * c_s
            serial_tokens += m
            continue
        k = min(ctrl.k, n - emitted)
        alpha = _alpha_at(phases, emitted)
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        t = (k * c_d + v0 + v1 * k) * spikes.get(cycles, 1.0)
        timed = ctrl.timing_cycle()
        ctrl.record_cycle(k, accepted, measured(t), measured(k * c_d) if timed else None)
        account(emitted, t, accepted + 1)
        emitted += accepted + 1
        spent += t
        cycles += 1
        k_cycles[k] = k_cycles.get(k, 0) + 1

    def fixed(k: int, alpha: float) -> float:
        e = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
        return e * c_s / (k * c_d + v0 + v1 * k)

    mean_alpha = sum(_alpha_at(phases, t) for t in range(n)) / n
    best = max(fixed(k, mean_alpha) for k in range(1, sc["k_max"] + 1))
    return {
        "speedup": n * c_s / spent,
        "best_fixed": best,
        "serial_share": serial_tokens / n,
        "cycles": cycles,
        "k_cycles": {str(k): c for k, c in sorted(k_cycles.items())},
        "per_phase": [phase_tokens[i] * c_s / phase_time[i] for i in sorted(phase_time)],
    }


if __name__ == "__main__":
    payload = read_payload()
    emit({"scenarios": {sc["id"]: simulate(sc) for sc in payload["scenarios"]}})
