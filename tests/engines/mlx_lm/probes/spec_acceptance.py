"""Probe: measured speculative acceptance against its expectation, per reached draft position (patched arm).

Payload: {"target": folder, "draft": folder | null (null: ``draft_kind="mtp"``, the target loaded with keep_mtp),
"prompts": [text, ...], "k": drafts per cycle, "max_tokens": int, "temps": [T, ...], "seeds": int}.

For every temperature, every prompt and every seed, ``speculative_generate_step`` runs with ``make_sampler(T)``
(``T = 0``: greedy) and a fixed draft length ``k``. At ``T > 0`` ``generate.speculative_accept`` is wrapped: for
each verify it records, at each drafted position, ``sum(min(p, q))`` of the two tempered distributions it is given
(the probability that rejection sampling accepts there), whether the target's and the drafter's most probable tokens
agree (what the greedy verify would accept in the same context), and the accept flags it returned. A position is
*reached* when every earlier draft of its cycle was accepted; given its context, a reached position accepts with
probability ``sum(min(p, q))`` exactly, so over the reached positions the number accepted has mean ``sum e`` and
variance ``sum e (1 - e)``: ``z`` measures the verify against that. At ``T = 0`` the cycle's own statistics
(``spec_stats``) give the greedy acceptance.

Result: {"temps": {T: {"drafted", "accepted", "acceptance_rate" (accepted / drafted, as bench_mlx.py reports it),
"reached", "reached_accepted", "per_reached" (accepted / reached), "position": [per position i: reached, accepted,
expected, argmax_agree], "expected", "expected_se", "z", "argmax_agree" (over reached positions, T > 0 only)}},
"mlx_lm": version}.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import mlx.core as mx
from probe_io import emit, read_payload


def main() -> None:
    p = read_payload()
    from mlx_lm import load
    from mlx_lm.sample_utils import make_sampler

    gen: Any = importlib.import_module("mlx_lm.generate")
    mtp = p.get("draft") is None
    model, tokenizer = load(p["target"], model_config={"keep_mtp": True}) if mtp else load(p["target"])
    draft = None if mtp else load(p["draft"])[0]
    k = int(p["k"])
    ids = [tokenizer.encode(t) for t in p["prompts"]]
    original = gen.speculative_accept
    records: list[tuple[mx.array, mx.array, mx.array]] = []

    def recording_accept(target_logits: mx.array, draft_logits: mx.array, draft_tokens: mx.array) -> Any:
        accept, residual = original(target_logits, draft_logits, draft_tokens)
        pp = mx.softmax(target_logits.astype(mx.float32), axis=-1)
        qq = mx.softmax(draft_logits.astype(mx.float32), axis=-1)
        overlap = mx.minimum(pp, qq).sum(axis=-1)
        agree = mx.argmax(target_logits, axis=-1) == mx.argmax(draft_logits, axis=-1)
        records.append((overlap, agree, accept))
        return accept, residual

    gen.speculative_accept = recording_accept
    out: dict[str, Any] = {}
    try:
        for temp in p["temps"]:
            sampler = make_sampler(temp) if temp > 0 else None
            pos = [
                {"reached": 0, "accepted": 0, "expected": 0.0, "var": 0.0, "argmax_agree": 0}
                for _ in range(k)
            ]
            drafted = accepted = 0
            for j, prompt in enumerate(ids):
                for seed in range(int(p["seeds"]) if temp > 0 else 1):
                    mx.random.seed(1000 * j + seed)
                    records.clear()
                    stats = gen.SpeculativeStats("mtp" if mtp else "model")
                    kwargs: dict[str, Any] = {"draft_kind": "mtp"} if mtp else {}
                    for _ in gen.speculative_generate_step(
                        mx.array(prompt),
                        model,
                        draft,
                        num_draft_tokens=k,
                        max_tokens=int(p["max_tokens"]),
                        sampler=sampler,
                        spec_stats=stats,
                        **kwargs,
                    ):
                        pass
                    s = stats.as_dict()
                    drafted += s["drafted"]
                    accepted += s["accepted"]
                    if temp == 0:
                        # Greedy: a position is reached when the earlier ones were accepted.
                        reached = [s["position_drafted"][0]] + s["position_accepted"][:-1]
                        for i in range(len(s["position_drafted"])):
                            pos[i]["reached"] += reached[i]
                            pos[i]["accepted"] += s["position_accepted"][i]
                        continue
                    mx.eval(records)
                    for overlap, agree, acc in records:
                        ov, ag, ac = overlap.tolist(), agree.tolist(), acc.tolist()
                        for i in range(len(ov)):
                            pos[i]["reached"] += 1
                            pos[i]["expected"] += ov[i]
                            pos[i]["var"] += ov[i] * (1.0 - ov[i])
                            pos[i]["argmax_agree"] += int(ag[i])
                            if not ac[i]:
                                break
                            pos[i]["accepted"] += 1
            reached = sum(x["reached"] for x in pos)
            reached_acc = sum(x["accepted"] for x in pos)
            row: dict[str, Any] = {
                "drafted": drafted,
                "accepted": accepted,
                "acceptance_rate": accepted / drafted if drafted else 0.0,
                "reached": reached,
                "reached_accepted": reached_acc,
                "per_reached": reached_acc / reached if reached else 0.0,
                "position": [
                    {
                        "reached": x["reached"],
                        "accepted": x["accepted"],
                        "per_reached": x["accepted"] / x["reached"] if x["reached"] else 0.0,
                        **(
                            {
                                "expected": x["expected"] / x["reached"] if x["reached"] else 0.0,
                                "argmax_agree": x["argmax_agree"] / x["reached"] if x["reached"] else 0.0,
                            }
                            if temp > 0
                            else {}
                        ),
                    }
                    for x in pos
                ],
            }
            if temp > 0 and reached:
                expected = sum(x["expected"] for x in pos)
                var = sum(x["var"] for x in pos)
                row["expected"] = expected / reached
                row["expected_se"] = math.sqrt(var) / reached
                row["z"] = (reached_acc - expected) / math.sqrt(var) if var > 0 else 0.0
                row["argmax_agree"] = sum(x["argmax_agree"] for x in pos) / reached
            out[str(temp)] = row
    finally:
        gen.speculative_accept = original
    emit({"temps": out, "mlx_lm": importlib.import_module("mlx_lm").__version__})


if __name__ == "__main__":
    main()
