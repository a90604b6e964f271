"""What a check feeds the engine: prompts (built-in or the user's JSONL), the teacher-forced corpus (built-in or the
user's text), the never-right drafter, and the wheels it compares (pinned and built, or given).

A prompts file is JSON Lines, one prompt a line: ``{"text": "..."}`` or ``{"messages": [{"role": "user", "content":
"..."}, ...]}`` (rendered with the model's chat template in the stock arm), each with an optional ``"category"`` and
``"id"``. A corpus file is plain UTF-8 text (documents separated by blank lines) or JSONL ``{"text": ...}`` (a
``.jsonl`` name). Every problem is a UsageError naming the file, the line and the next step; nothing is run first.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from overlay.check.adapter import EngineAdapter, Models
from overlay.check.envs import Arm
from overlay.errors import UsageError

ROLES = ("system", "user", "assistant", "tool", "developer")
PROMPT_KEYS = {"text", "messages", "category", "id"}
WORKERS = Path(__file__).parent / "workers"


@dataclass(frozen=True)
class PromptSpec:
    category: str
    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None


def _bad(path: Path, lineno: int, what: str) -> UsageError:
    return UsageError(
        f"--prompts {path}: line {lineno}: {what}",
        tip='one JSON object a line: {"text": "..."} or {"messages": [{"role": "user", "content": "..."}]}',
    )


def load_prompts(path: Path) -> list[PromptSpec]:
    """Parse and validate a prompts file (JSONL)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"--prompts {path}: cannot read it ({exc.strerror or exc})", tip="pass a JSONL file"
        ) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"--prompts {path}: not UTF-8 (byte {exc.start})", tip="save the file as UTF-8"
        ) from exc
    out: list[PromptSpec] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _bad(path, lineno, f"not JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(obj, dict):
            raise _bad(path, lineno, f"a JSON {type(obj).__name__}, not an object")
        extra = sorted(set(obj) - PROMPT_KEYS)
        if extra:
            raise _bad(
                path,
                lineno,
                f"unknown key(s) {', '.join(map(repr, extra))} (known: text, messages, category, id)",
            )
        if ("text" in obj) == ("messages" in obj):
            raise _bad(path, lineno, 'needs exactly one of "text" and "messages"')
        category = obj.get("category", obj.get("id", f"line {lineno}"))
        if not isinstance(category, (str, int)):
            raise _bad(path, lineno, '"category" must be a string')
        if "text" in obj:
            if not isinstance(obj["text"], str) or not obj["text"].strip():
                raise _bad(path, lineno, '"text" must be a non-empty string')
            out.append(PromptSpec(category=str(category), text=obj["text"]))
            continue
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise _bad(path, lineno, '"messages" must be a non-empty list')
        conv: list[tuple[str, str]] = []
        for i, m in enumerate(msgs):
            if (
                not isinstance(m, dict)
                or not isinstance(m.get("role"), str)
                or not isinstance(m.get("content"), str)
            ):
                raise _bad(path, lineno, f'message {i} needs string "role" and "content"')
            if m["role"] not in ROLES:
                raise _bad(path, lineno, f"message {i}: role {m['role']!r} is not one of {', '.join(ROLES)}")
            conv.append((m["role"], m["content"]))
        out.append(PromptSpec(category=str(category), messages=tuple(conv)))
    if not out:
        raise UsageError(f"--prompts {path}: no prompts (the file is empty)", tip="one JSON object a line")
    return out


def load_corpus(path: Path) -> list[str]:
    """The documents of a corpus file (plain text split on blank lines, or JSONL {"text": ...})."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"--corpus {path}: cannot read it ({exc.strerror or exc})", tip="pass a text file"
        ) from exc
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"--corpus {path}: not UTF-8 (byte {exc.start})", tip="save the file as UTF-8"
        ) from exc
    docs: list[str] = []
    if path.suffix == ".jsonl":
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(
                    f"--corpus {path}: line {lineno}: not JSON ({exc.msg})", tip='one {"text": "..."} a line'
                ) from exc
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise UsageError(
                    f'--corpus {path}: line {lineno}: needs a string "text"', tip='one {"text": "..."} a line'
                )
            docs.append(obj["text"])
    else:
        docs = [d.strip() for d in text.split("\n\n")]
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise UsageError(f"--corpus {path}: no text", tip="pass a file with the text the engine will see")
    return docs


def prompt_set(
    adapter: EngineAdapter, arm: Arm, models: Models, specs: list[PromptSpec] | None = None
) -> tuple[list[dict[str, Any]], list[list[int]], dict[str, Any]]:
    """Prompts with their token ids, and where they came from (for the report)."""
    from overlay.check import models as tinymodels

    if specs is None:
        prompts: list[dict[str, Any]] = [{"category": c, "text": t} for c, t in tinymodels.all_prompts()]
        source: dict[str, Any] = {"source": "built-in", "count": len(prompts)}
    else:
        convs = [[{"role": r, "content": c} for r, c in s.messages] for s in specs if s.messages is not None]
        rendered: list[str] = []
        template = None
        if convs:
            res = arm.run_json(
                WORKERS / "chat_template.py",
                {"model": str(models.target), "conversations": convs},
                timeout=600,
            )
            rendered, template = list(res["texts"]), res["template"]
        it = iter(rendered)
        prompts = [
            {
                "category": s.category,
                "text": s.text if s.text is not None else next(it),
                "chat": s.messages is not None,
            }
            for s in specs
        ]
        source = {"source": "file", "count": len(prompts), "chat": len(convs), "chat_template": template}
    res = adapter.run(
        arm, {"task": "tokenize", "model": str(models.target), "prompts": [p["text"] for p in prompts]}
    )
    for p, ids in zip(prompts, res["ids"]):
        p["vocab_size"] = res.get("vocab_size")
        if not ids:
            raise UsageError(f"prompt {p['category']!r} tokenizes to no tokens", tip="give it some text")
    return prompts, res["ids"], source


def teacher_sequences(
    adapter: EngineAdapter,
    arm: Arm,
    models: Models,
    *,
    positions: int,
    seq_len: int,
    docs: list[str] | None = None,
) -> list[list[int]]:
    """Token sequences from the corpus (the built-in one, a held-out seed, unless ``docs``), enough for
    ``positions`` scored positions (a short corpus is scored again, shifted by one token per pass)."""
    from overlay.check.models import corpus

    given = docs is not None
    texts = docs if docs is not None else corpus.documents(max(64, positions // 40), seed=7_777)
    ids = adapter.run(arm, {"task": "tokenize", "model": str(models.target), "prompts": texts})["ids"]
    stream = [t for doc in ids for t in doc]
    if len(stream) < seq_len + 1:
        where = "--corpus file" if given else "built-in corpus"
        raise UsageError(
            f"the {where} has {len(stream)} tokens, fewer than --seq-len {seq_len} + 1",
            tip="give a longer corpus" if given else "lower --seq-len",
        )
    seqs: list[list[int]] = []
    need = positions
    pos = 0
    while need > 0:
        if pos + seq_len + 1 > len(stream):
            pos = 0
            stream = stream[1:] + stream[:1]  # shift so repeated passes score different windows
        seqs.append(stream[pos : pos + seq_len + 1])
        pos += seq_len + 1
        need -= seq_len
    return seqs


def never_right_draft(target: Path, out: Path) -> Path:
    """A copy of ``target`` whose output head is rolled by one row: its argmax is always the target's + 1 (mod V), so
    every first draft token is wrong. Exercises rejection and rollback; outputs must stay identical."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in target.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy2(f, out / f.name)
    config = json.loads((target / "config.json").read_text())
    files = sorted(target.glob("*.safetensors"))
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    head = next((k for k in tensors if k.endswith("lm_head.weight")), None)
    if head is None:
        embed = next(k for k in tensors if k.endswith("embed_tokens.weight"))
        head = embed.replace("model.embed_tokens.weight", "lm_head.weight").replace(
            "embed_tokens.weight", "lm_head.weight"
        )
        tensors[head] = tensors[embed].copy()
        config["tie_word_embeddings"] = False
        (out / "config.json").write_text(json.dumps(config, indent=2))
    tensors[head] = np.roll(tensors[head], 1, axis=0)
    for old in out.glob("*.safetensors*"):
        old.unlink()
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    return out
