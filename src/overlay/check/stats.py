"""Statistics of `overlay check` (definitions follow docs/check.md; numpy only).

- Teacher-forced agreement between a reference (stock) and a candidate (patched) on the same token stream:
  per position KLD(stock || patched) over the full vocabulary, top-1 agreement, NLL of the actual next token.
- Standard errors by block bootstrap over prompts (positions inside one prompt are correlated; prompts are the blocks).
- Speed ratio patched/stock with a 95% bootstrap CI over paired repetitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_RNG_SEED = 20261130


@dataclass(frozen=True)
class SeqAgreement:
    """Per-position numbers of one sequence."""

    kld: np.ndarray  # [T]
    top1_same: np.ndarray  # [T] bool
    nll_ref: np.ndarray  # [T]
    nll_cand: np.ndarray  # [T]
    max_abs_diff: float
    bit_identical: bool


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    out: np.ndarray = x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    return out


def agreement(ref_logprobs: np.ndarray, cand_logprobs: np.ndarray, targets: np.ndarray) -> SeqAgreement:
    """``*_logprobs``: [T, V] log-probabilities (or logits; they are normalised here); ``targets``: [T] next tokens."""
    if ref_logprobs.shape != cand_logprobs.shape:
        raise ValueError(f"logit shapes differ: {ref_logprobs.shape} vs {cand_logprobs.shape}")
    identical = bool(np.array_equal(ref_logprobs, cand_logprobs))
    diff = float(np.max(np.abs(ref_logprobs.astype(np.float64) - cand_logprobs.astype(np.float64)))) if ref_logprobs.size else 0.0
    lp = log_softmax(ref_logprobs)
    lq = log_softmax(cand_logprobs)
    p = np.exp(lp)
    kld = np.sum(p * (lp - lq), axis=-1)
    kld = np.maximum(kld, 0.0)  # rounding can give -1e-17
    idx = np.arange(len(targets))
    return SeqAgreement(
        kld=kld,
        top1_same=np.argmax(lp, axis=-1) == np.argmax(lq, axis=-1),
        nll_ref=-lp[idx, targets],
        nll_cand=-lq[idx, targets],
        max_abs_diff=diff,
        bit_identical=identical,
    )


def _bootstrap_means(blocks: Sequence[tuple[float, int]], n: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``n`` resamples of blocks (sum, count), with replacement."""
    sums = np.array([b[0] for b in blocks], dtype=np.float64)
    counts = np.array([b[1] for b in blocks], dtype=np.float64)
    picks = rng.integers(0, len(blocks), size=(n, len(blocks)))
    means: np.ndarray = sums[picks].sum(axis=1) / np.maximum(counts[picks].sum(axis=1), 1)
    return means


def summarize(seqs: Sequence[SeqAgreement], *, n_boot: int = 1000) -> dict[str, float | int | bool | list[float]]:
    """Mean KLD with block-bootstrap SE, percentiles, top-1 agreement, paired delta NLL with SE."""
    rng = np.random.default_rng(_RNG_SEED)
    kld = np.concatenate([s.kld for s in seqs]) if seqs else np.zeros(0)
    top1 = np.concatenate([s.top1_same for s in seqs]) if seqs else np.zeros(0, dtype=bool)
    dnll = np.concatenate([s.nll_cand - s.nll_ref for s in seqs]) if seqs else np.zeros(0)
    positions = int(kld.size)
    if positions == 0:
        return {"positions": 0}
    boot_kld = _bootstrap_means([(float(s.kld.sum()), s.kld.size) for s in seqs], n_boot, rng)
    boot_top1 = _bootstrap_means([(float(s.top1_same.sum()), s.top1_same.size) for s in seqs], n_boot, rng)
    boot_dnll = _bootstrap_means([(float((s.nll_cand - s.nll_ref).sum()), s.kld.size) for s in seqs], n_boot, rng)
    return {
        "positions": positions,
        "sequences": len(seqs),
        "bit_identical": all(s.bit_identical for s in seqs),
        "max_abs_diff": max(s.max_abs_diff for s in seqs),
        "kld_mean": float(kld.mean()),
        "kld_se": float(boot_kld.std(ddof=1)),
        "kld_median": float(np.median(kld)),
        "kld_p99": float(np.percentile(kld, 99)),
        "kld_max": float(kld.max()),
        "top1_agreement": float(top1.mean()),
        "top1_se": float(boot_top1.std(ddof=1)),
        "dnll": float(dnll.mean()),
        "dnll_se": float(boot_dnll.std(ddof=1)),
        "nll_stock": float(np.concatenate([s.nll_ref for s in seqs]).mean()),
        "kld_histogram": histogram(kld),
    }


def histogram(values: np.ndarray, bins: int = 20) -> list[float]:
    """Counts of log10(KLD) in ``bins`` bins from -12 to 0 (zeros go to the first bin); for the HTML plot."""
    logs = np.log10(np.maximum(values, 1e-12))
    counts, _ = np.histogram(np.clip(logs, -12, 0), bins=bins, range=(-12, 0))
    return [int(c) for c in counts]


def ratio_ci(candidate: Sequence[float], reference: Sequence[float], *, n_boot: int = 2000) -> dict[str, float]:
    """Ratio of medians candidate/reference with a 95% bootstrap CI over paired repetitions."""
    c = np.asarray(candidate, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    n = min(len(c), len(r))
    if n == 0:
        return {"ratio": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "n": 0}
    c, r = c[:n], r[:n]
    rng = np.random.default_rng(_RNG_SEED)
    picks = rng.integers(0, n, size=(n_boot, n))
    ratios = np.median(c[picks], axis=1) / np.median(r[picks], axis=1)
    return {
        "ratio": float(np.median(c) / np.median(r)),
        "ci_low": float(np.percentile(ratios, 2.5)),
        "ci_high": float(np.percentile(ratios, 97.5)),
        "n": int(n),
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}
