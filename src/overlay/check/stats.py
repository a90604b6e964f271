"""Statistics of `overlay check` (definitions follow docs/check.md; numpy only).

- Teacher-forced agreement between a reference (stock) and a candidate (patched) on the same token stream:
  per position KLD(stock || patched) over the full vocabulary, top-1 agreement, NLL of the actual next token.
- Standard errors by block bootstrap over prompts (positions inside one prompt are correlated; prompts are the blocks).
- Speed ratio patched/stock over paired repetitions with a 95% log-ratio t-interval; a ratio whose interval spans
  1.0 is inconclusive (speed_verdict).
- Chi-square homogeneity of two samples of tokens (the sampling-distribution check at temperature > 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
    diff = (
        float(np.max(np.abs(ref_logprobs.astype(np.float64) - cand_logprobs.astype(np.float64))))
        if ref_logprobs.size
        else 0.0
    )
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


def summarize(
    seqs: Sequence[SeqAgreement], *, n_boot: int = 1000
) -> dict[str, float | int | bool | list[float]]:
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
    boot_dnll = _bootstrap_means(
        [(float((s.nll_cand - s.nll_ref).sum()), s.kld.size) for s in seqs], n_boot, rng
    )
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


# two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (standard tables)
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
RATIO_COVERAGE = 0.95
RATIO_METHOD = (
    "paired log-ratio t-interval (95%): exp(mean +/- t * sd / sqrt(n)) of log(candidate/reference) per rep"
)


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (table to 30, Cornish-Fisher beyond)."""
    if df < 1:
        raise ValueError("t quantile needs at least 1 degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def ratio_ci(candidate: Sequence[float], reference: Sequence[float]) -> dict[str, Any]:
    """Ratio candidate/reference over paired repetitions (rep i of each arm ran back to back, interleaved) with a
    95% interval: the geometric mean of the per-repetition ratios, exp(mean log ratio), and a t-interval on the
    log ratios. Timing noise is multiplicative, so the log ratio is close to normal and the t-interval keeps its
    coverage at a handful of repetitions (tests/check/test_verdicts.py simulates it); one repetition gives no
    interval (ci_low and ci_high None)."""
    c = np.asarray(candidate, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    n = min(len(c), len(r))
    nan = float("nan")
    if n == 0:
        return {"ratio": nan, "ci_low": None, "ci_high": None, "n": 0, "method": RATIO_METHOD}
    c, r = c[:n], r[:n]
    if np.any(c <= 0) or np.any(r <= 0):
        raise ValueError("ratio_ci needs positive samples")
    d = np.log(c) - np.log(r)
    mean = float(d.mean())
    if n < 2:
        return {"ratio": float(np.exp(mean)), "ci_low": None, "ci_high": None, "n": 1, "method": RATIO_METHOD}
    half = t975(n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
    return {
        "ratio": float(np.exp(mean)),
        "ci_low": float(np.exp(mean - half)),
        "ci_high": float(np.exp(mean + half)),
        "n": int(n),
        "method": RATIO_METHOD,
        "ratio_of_medians": float(np.median(c) / np.median(r)),
    }  # unpaired, for context only


def speed_verdict(ratio: dict[str, Any], *, higher_is_better: bool) -> str:
    """ "better", "worse" or "inconclusive" (the interval spans 1.0, or there is none) for a candidate/reference
    ratio; ``higher_is_better``: tok/s (True) or seconds (False, e.g. cold start)."""
    low, high = ratio.get("ci_low"), ratio.get("ci_high")
    if (
        not isinstance(low, (int, float))
        or not isinstance(high, (int, float))
        or not (math.isfinite(low) and math.isfinite(high))
    ):
        return "inconclusive"
    if low <= 1.0 <= high:
        return "inconclusive"
    up = low > 1.0
    return "better" if up == higher_is_better else "worse"


def _gammainc_upper(a: float, x: float) -> float:
    """The regularized upper incomplete gamma Q(a, x) (series below a + 1, continued fraction above)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        k = a
        for _ in range(10_000):
            k += 1
            term *= x / k
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - lg))
    tiny = 1e-300
    b = x + 1 - a
    cc = 1 / tiny
    dd = 1 / b
    h = dd
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        dd = an * dd + b
        dd = tiny if abs(dd) < tiny else dd
        cc = b + an / cc
        cc = tiny if abs(cc) < tiny else cc
        dd = 1 / dd
        delta = dd * cc
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, math.exp(-x + a * math.log(x) - lg) * h)


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with ``df`` degrees of freedom."""
    return 1.0 if df <= 0 else _gammainc_upper(df / 2, x / 2)


def homogeneity(a: Sequence[int], b: Sequence[int], *, min_expected: float = 5.0) -> dict[str, Any]:
    """Chi-square test that two samples of categories (token ids) come from one distribution: a 2 x K contingency
    table, categories whose expected count is below ``min_expected`` pooled into one. p = 1 when they cannot differ
    (one category)."""
    cats = sorted(set(a) | set(b))
    ca = np.array([list(a).count(t) for t in cats], dtype=np.float64)
    cb = np.array([list(b).count(t) for t in cats], dtype=np.float64)
    na, nb = ca.sum(), cb.sum()
    if na == 0 or nb == 0:
        return {"chi2": 0.0, "df": 0, "p": 1.0, "categories": len(cats), "n": int(na + nb)}
    tot = ca + cb
    expected_small = np.minimum(tot * na, tot * nb) / (na + nb) < min_expected
    if expected_small.any():
        ca = np.append(ca[~expected_small], ca[expected_small].sum())
        cb = np.append(cb[~expected_small], cb[expected_small].sum())
        keep = (ca + cb) > 0
        ca, cb = ca[keep], cb[keep]
    tot = ca + cb
    ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
    chi2 = float(((ca - ea) ** 2 / ea).sum() + ((cb - eb) ** 2 / eb).sum())
    df = len(tot) - 1
    return {"chi2": chi2, "df": int(df), "p": chi2_sf(chi2, df), "categories": len(cats), "n": int(na + nb)}


def goodness_of_fit(
    counts: Sequence[int], probs: Sequence[float], *, min_expected: float = 5.0
) -> dict[str, Any]:
    """Chi-square test of observed category ``counts`` against the exact distribution ``probs`` (same order),
    categories whose expected count is below ``min_expected`` pooled into one."""
    n = sum(counts)
    cells: list[tuple[float, float]] = []
    pooled_o = pooled_e = 0.0
    for o, p in zip(counts, probs):
        e = n * p
        if e >= min_expected:
            cells.append((float(o), e))
        else:
            pooled_o += o
            pooled_e += e
    if pooled_e > 0 or pooled_o > 0:
        cells.append((pooled_o, max(pooled_e, 1e-12)))
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    return {"chi2": chi2, "df": df, "p": chi2_sf(chi2, df), "n": int(n)}


def fmt_ratio(r: dict[str, Any] | None, digits: int = 3, unit: str = "") -> str:
    """``1.234 [1.100, 1.380]`` (or ``[no interval]`` from one repetition); ``digits`` decimals, ``unit`` after the
    ratio (``fmt_ratio(r, 2, "x")``: ``1.23x [1.10, 1.38]``)."""
    if not r:
        return "-"
    ci = (
        f"[{r['ci_low']:.{digits}f}, {r['ci_high']:.{digits}f}]"
        if isinstance(r.get("ci_low"), (int, float)) and isinstance(r.get("ci_high"), (int, float))
        else "[no interval]"
    )
    return f"{r['ratio']:.{digits}f}{unit} {ci}"


def spread(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}
