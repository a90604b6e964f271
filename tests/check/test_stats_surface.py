from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from overlay.check import stats
from overlay.check.html import render
from overlay.check.surface import compare, module_surface


def test_kld_top1_and_dnll_on_known_distributions() -> None:
    p = np.log(np.array([[0.5, 0.25, 0.25], [0.9, 0.05, 0.05]]))
    q = np.log(np.array([[0.25, 0.5, 0.25], [0.9, 0.05, 0.05]]))
    a = stats.agreement(p, q, np.array([0, 0]))
    assert a.kld[0] == pytest.approx(0.5 * np.log(2) + 0.25 * np.log(0.5))
    assert a.kld[1] == pytest.approx(0.0, abs=1e-15)
    assert list(a.top1_same) == [False, True]
    assert (a.nll_cand - a.nll_ref)[0] == pytest.approx(np.log(2))
    assert not a.bit_identical and a.max_abs_diff > 0
    same = stats.agreement(p, p.copy(), np.array([1, 2]))
    assert same.bit_identical and same.kld.sum() == 0


def test_block_bootstrap_se_reflects_between_prompt_spread() -> None:
    rng = np.random.default_rng(0)
    seqs = []
    for i in range(20):
        ref = rng.normal(size=(50, 8))
        cand = ref + (0.0 if i % 2 else 0.3) * rng.normal(size=(50, 8))
        seqs.append(stats.agreement(ref, cand, rng.integers(0, 8, size=50)))
    s: dict[str, Any] = stats.summarize(seqs)
    assert s["positions"] == 1000 and s["sequences"] == 20
    assert s["kld_mean"] > 0 and 0 < s["kld_se"] < s["kld_mean"]
    assert 0 < s["top1_agreement"] < 1 and sum(s["kld_histogram"]) == 1000


def test_ratio_ci() -> None:
    r = stats.ratio_ci([2.0, 2.1, 1.9, 2.0, 2.05], [1.0, 1.0, 1.05, 0.95, 1.0])
    assert r["ratio"] == pytest.approx(2.0, rel=0.03) and r["ci_low"] > 1.8 and r["ci_high"] < 2.2
    same = stats.ratio_ci([1.0] * 5, [1.0] * 5)
    assert same["ratio"] == same["ci_low"] == same["ci_high"] == 1.0


STOCK = b"""
def generate(model, prompt, max_tokens=256, *, sampler=None):
    pass

def helper(a, b):
    pass

def _private(x):
    pass

class Cache:
    def trim(self, n):
        pass
    def state(self):
        pass
"""


@pytest.mark.parametrize(
    ("patched", "removed", "changed"),
    [
        (
            STOCK.replace(b"max_tokens=256, *,", b"max_tokens=256, *, draft=None,"),
            [],
            [],
        ),  # new kwarg with default
        (STOCK.replace(b"def helper(a, b)", b"def helper(a, b, c)"), [], ["mod.helper"]),
        (STOCK.replace(b"    def state(self):\n        pass\n", b""), ["mod.Cache.state"], []),
        (STOCK.replace(b"def helper(a, b)", b"def helper(b, a)"), [], ["mod.helper"]),
        (STOCK.replace(b"max_tokens=256", b"max_tokens"), [], ["mod.generate"]),
        (STOCK.replace(b"def _private(x)", b"def _private(y)"), [], []),
    ],
)
def test_surface_compare(patched: bytes, removed: list[str], changed: list[str]) -> None:
    def surf(src: bytes) -> dict[str, Any]:
        return {"modules": {"mod": module_surface(src)}, "entry_points": {"console_scripts:tool": "mod:main"}}

    result = compare(surf(STOCK), surf(patched))
    assert result["removed"] == removed
    assert [c["symbol"] for c in result["changed"]] == changed
    assert result["compatible"] == (not removed and not changed)


def test_html_renders_every_section_self_contained() -> None:
    report = {
        "engine": "demo",
        "verdict": "fail",
        "mode": "engine",
        "created": "now",
        "arms": {
            "stock": {"wheel": "a.whl", "version": "1"},
            "patched": {"wheel": "b.whl", "version": "1+ovl"},
        },
        "series": {
            "class": "exact",
            "patches": [{"name": "0001-x.patch", "numerics": "exact", "theme": "other", "subject": "x <b>"}],
        },
        "gates": [
            {
                "subject": "series",
                "class": "exact",
                "gate": "greedy identical",
                "passed": False,
                "detail": "19/20",
            }
        ],
        "logits": stats.summarize(
            [stats.agreement(np.zeros((4, 3)), np.ones((4, 3)) * [0, 1, 2], np.array([0, 1, 2, 0]))]
        ),
        "speed": {
            "stock": {"decode_tok_s": stats.spread([1, 2, 3])},
            "patched": {"decode_tok_s": stats.spread([2, 3, 4])},
            "ratio": {"decode": stats.ratio_ci([2, 3, 4], [1, 2, 3])},
        },
        "per_patch": [
            {
                "patch": "0001-x.patch",
                "numerics": "exact",
                "greedy_identical_to_previous": True,
                "decode_ratio_vs_previous": stats.ratio_ci([2, 3], [1, 2]),
            }
        ],
    }
    page = render(report)
    assert "x &lt;b&gt;" in page and "FAIL" in page and page.count("<svg") >= 3
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
