"""The user's inputs: prompts (JSONL text or chat), a corpus, given wheels, the sampling-distribution check."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from overlay.check import sampling
from overlay.check.artifacts import given_wheel, patches_of
from overlay.check.inputs import load_corpus, load_prompts, teacher_sequences
from overlay.core.manifest import Artifact
from overlay.engines import Models
from overlay.errors import UsageError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import make_wheel

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, lines: list[str], name: str = "p.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_prompts_text_and_chat(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        [
            json.dumps({"text": "def f():", "category": "code"}),
            "",
            json.dumps(
                {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
            ),
        ],
    )
    specs = load_prompts(f)
    assert [s.category for s in specs] == ["code", "line 3"]
    assert specs[0].text == "def f():" and specs[1].messages == (("system", "be brief"), ("user", "hi"))


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"text": "ok"', "line 2: not JSON"),
        ('["text"]', "line 2: a JSON list, not an object"),
        ('{"txt": "x"}', "line 2: unknown key(s) 'txt'"),
        ('{"text": "x", "messages": []}', "line 2: needs exactly one of"),
        ('{"text": "  "}', 'line 2: "text" must be a non-empty string'),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "line 2: message 0: role 'robot'"),
        ('{"messages": [{"role": "user"}]}', "line 2: message 0 needs string"),
    ],
)
def test_bad_prompt_lines_name_the_line(tmp_path: Path, line: str, why: str) -> None:
    f = _write(tmp_path, [json.dumps({"text": "fine"}), line])
    with pytest.raises(UsageError) as exc:
        load_prompts(f)
    assert why in str(exc.value) and str(f) in str(exc.value) and exc.value.return_code == 2


def test_empty_or_missing_prompts_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no prompts"):
        load_prompts(_write(tmp_path, ["", "  "]))
    with pytest.raises(UsageError, match="cannot read it"):
        load_prompts(tmp_path / "absent.jsonl")
    bad = tmp_path / "latin.jsonl"
    bad.write_bytes(b'{"text": "caf\xe9"}\n')
    with pytest.raises(UsageError, match="not UTF-8"):
        load_prompts(bad)


def test_corpus_plain_and_jsonl(tmp_path: Path) -> None:
    plain = tmp_path / "c.txt"
    plain.write_text("first doc\nline two\n\n\nsecond doc\n")
    assert load_corpus(plain) == ["first doc\nline two", "second doc"]
    jl = _write(tmp_path, [json.dumps({"text": "a"}), json.dumps({"text": "b"})], "c.jsonl")
    assert load_corpus(jl) == ["a", "b"]
    with pytest.raises(UsageError, match="line 2: needs a string"):
        load_corpus(_write(tmp_path, [json.dumps({"text": "a"}), json.dumps({"x": 1})], "d.jsonl"))
    empty = tmp_path / "e.txt"
    empty.write_text("\n\n")
    with pytest.raises(UsageError, match="no text"):
        load_corpus(empty)


class _Tok:
    engine = "demo"

    def run(self, arm: Any, request: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        return {"ids": [[ord(c) for c in text] for text in request["prompts"]], "vocab_size": 256}


def test_teacher_sequences_from_a_given_corpus(tmp_path: Path) -> None:
    models = Models(target=tmp_path)
    seqs = teacher_sequences(_Tok(), None, models, positions=40, seq_len=8, docs=["abcdefghij", "klmnopqrst"])  # type: ignore[arg-type]
    assert sum(len(s) - 1 for s in seqs) >= 40 and all(len(s) == 9 for s in seqs)
    assert seqs[0] == [ord(c) for c in "abcdefghi"]
    with pytest.raises(UsageError, match=r"--corpus file has 3 tokens, fewer than --seq-len 8 \+ 1"):
        teacher_sequences(_Tok(), None, models, positions=40, seq_len=8, docs=["abc"])  # type: ignore[arg-type]


def _manifest() -> Any:
    pin = Artifact(filename="demo_engine-1.2.0-py3-none-any.whl", sha256="0" * 64)
    return SimpleNamespace(
        name="demo",
        path=Path("overlays/demo.toml"),
        distribution="demo-engine",
        distribution_of=lambda a: a.distribution or "demo-engine",
        upstream=SimpleNamespace(allow_members=(), artifacts=(pin,), primary=pin),
    )


def test_given_wheels_are_validated(tmp_path: Path) -> None:
    files = {"demo_pkg/__init__.py": b"x = 1\n"}
    stock = make_wheel(tmp_path / "s" / "demo_engine-1.2.0-py3-none-any.whl", files)
    prov = {
        "series": {
            "sha256": "a" * 64,
            "patches": [{"name": "0001-x.patch", "sha256": "f" * 64, "numerics": "lossless"}],
        }
    }
    patched = make_wheel(
        tmp_path / "p" / "demo_engine-1.2.0+ovl.1.gaaaa-py3-none-any.whl",
        {**files, "demo_engine-1.2.0+ovl.1.gaaaa.dist-info/overlay.json": json.dumps(prov).encode()},
        version="1.2.0+ovl.1.gaaaa",
    )
    assert given_wheel(stock, _manifest(), option="--stock-wheel", patched=False).version == "1.2.0"
    g = given_wheel(patched, _manifest(), option="--patched-wheel", patched=True)
    held, notes = patches_of(g, ())
    assert held == () and "not in the current series" in notes[0]
    with pytest.raises(UsageError, match="carries no overlay.json"):
        given_wheel(stock, _manifest(), option="--patched-wheel", patched=True)
    with pytest.raises(UsageError, match="is an overlay-built"):
        given_wheel(patched, _manifest(), option="--stock-wheel", patched=False)
    other = make_wheel(
        tmp_path / "o" / "other_engine-1.0-py3-none-any.whl", files, dist="other_engine", version="1.0"
    )
    with pytest.raises(UsageError, match="is a wheel of 'other_engine', not 'demo-engine'"):
        given_wheel(other, _manifest(), option="--stock-wheel", patched=False)
    with pytest.raises(UsageError, match="not a wheel file"):
        given_wheel(tmp_path / "nope.whl", _manifest(), option="--stock-wheel", patched=False)
    broken = tmp_path / "b" / "demo_engine-1.2.0-py3-none-any.whl"
    broken.parent.mkdir()
    broken.write_bytes(stock.read_bytes()[:100])
    with pytest.raises(UsageError):
        given_wheel(broken, _manifest(), option="--stock-wheel", patched=False)


def test_sampling_compare_detects_a_changed_distribution() -> None:
    import numpy as np

    rng = np.random.default_rng(5)

    def runs(p: list[float], n: int) -> list[list[list[int]]]:
        return [[rng.choice(4, size=3, p=p).tolist() for _ in range(n)]]

    same = sampling.compare(
        runs([0.4, 0.3, 0.2, 0.1], 300),
        runs([0.4, 0.3, 0.2, 0.1], 300),
        categories=["a"],
        temperature=0.7,
        positions=3,
    )
    assert same["equal"] and same["informative_tests"] == 3 and sampling.gate(same, "lossless")["passed"]
    moved = sampling.compare(
        runs([0.4, 0.3, 0.2, 0.1], 300),
        runs([0.25, 0.45, 0.2, 0.1], 300),
        categories=["a"],
        temperature=0.7,
        positions=3,
    )
    assert not moved["equal"] and not sampling.gate(moved, "lossless")["passed"]
    a = runs([0.4, 0.3, 0.2, 0.1], 50)
    ident = sampling.compare(a, a, categories=["a"], temperature=0.7, positions=3)
    assert ident["identical_runs"] == ident["runs"] == 50 and ident["min_p"] == 1.0
    assert "seed for seed" in sampling.gate(ident, "exact")["detail"]
    once = sampling.compare(a, a, categories=["a"], temperature=0.7, positions=3, seeded=False)
    assert (
        "one seeded engine" in sampling.gate(once, "exact")["detail"]
        and not sampling.SEEDED_PER_RUN["sglang"]
    )


def test_cli_bad_prompts_file_exits_2_before_building(cli: Any, tmp_path: Path) -> None:
    f = _write(tmp_path, ['{"text": "a"}', "{oops"])
    r = cli("--root", str(REPO), "check", "mlx-lm", "--prompts", str(f))
    assert r.code == 2 and "line 2: not JSON" in r.err


def test_cli_temperature_out_of_range(cli: Any) -> None:
    r = cli("--root", str(REPO), "check", "mlx-lm", "--temperature", "-1")
    assert r.code == 2 and "--temperature -1 is outside" in r.err


def test_cli_unknown_model_kind_names_the_kinds(cli: Any) -> None:
    r = cli("--root", str(REPO), "check", "mlx-lm", "--target-kind", "qwen3_5-randm")
    assert r.code == 2 and "did you mean 'qwen3_5-random'" in r.err and "deepseek_v3-random" in r.err


def test_a_given_model_folder_needs_a_config(tmp_path: Path) -> None:
    from overlay.check.adapter import given_models
    from overlay.engines import get_adapter
    from overlay.errors import UsageError

    assert given_models(None, tmp_path) is None
    with pytest.raises(UsageError, match="not a model folder"):
        given_models(tmp_path, None)
    (tmp_path / "config.json").write_text("{}")
    assert given_models(tmp_path, None) is not None
    # every engine's adapter takes the user's model through the same rule
    for name in ("mlx-lm", "sglang", "vllm"):
        with pytest.raises(UsageError, match="not a model folder"):
            get_adapter(name).models(root=tmp_path, arm=None, model=tmp_path / "x", draft=None, reporter=None)  # type: ignore[arg-type]
