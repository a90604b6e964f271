"""What every mlx-lm probe shares (run inside an arm's interpreter; a script's folder is on sys.path).

A probe reads one JSON payload on stdin and prints one JSON document on stdout; logs go to stderr. Settings are
applied for a block and restored after it: environment variables, and module globals named ``"module:attr"`` (a
module or attribute the arm does not have is skipped, so stock runs a patched-only setting as its default).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any


def read_payload() -> dict[str, Any]:
    text = sys.stdin.read()
    data: dict[str, Any] = json.loads(text) if text.strip() else {}
    return data


def emit(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


@contextlib.contextmanager
def env_override(env: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def patched_globals(spec: Mapping[str, Any]) -> Iterator[list[str]]:
    """Set ``module:attr`` globals for the block; yields the keys this arm has (the others are skipped)."""
    applied, saved = [], []
    try:
        for key, value in spec.items():
            mod_name, attr = key.split(":")
            try:
                mod = importlib.import_module(mod_name)
            except ImportError:
                continue
            if hasattr(mod, attr):
                saved.append((mod, attr, getattr(mod, attr)))
                setattr(mod, attr, value)
                applied.append(key)
        yield applied
    finally:
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)


@contextlib.contextmanager
def settings(spec: Mapping[str, Any]) -> Iterator[list[str]]:
    """``{"env": {...}, "globals": {...}}`` for the block; yields the globals applied."""
    with env_override(spec.get("env", {})), patched_globals(spec.get("globals", {})) as applied:
        yield applied
