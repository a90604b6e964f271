"""The OpenAI-compatible client of `overlay check --endpoints` (SGLang, vLLM, mlx_lm.server): reach a server and
pick its model (``discover``), send one request, streamed or not (``request``), and read the reply: text, token count,
log-probabilities, time to first token and the gaps between streamed chunks. Only the standard library
(http.client); a server-side problem is a failed :class:`Reply`, never an exception.

Prompts with ``messages`` go to /v1/chat/completions, ``text`` ones to /v1/completions; every request is greedy
(temperature 0) with the fixed ``SEED``.
"""

from __future__ import annotations

import http.client
import itertools
import json
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from overlay.check.inputs import PromptSpec
from overlay.errors import UsageError

SEED = 1234


@dataclass(frozen=True)
class Server:
    arm: str
    base: str  # scheme://host:port[/prefix], without a trailing /v1
    model: str | None


@dataclass
class Reply:
    ok: bool
    text: str = ""
    tokens: int = 0
    logprobs: list[float] | None = None
    token_ids: list[Any] | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    total_s: float = 0.0
    error: str | None = None

    @property
    def tok_s(self) -> float | None:
        if self.ttft_s is None or self.tokens < 2 or self.total_s <= self.ttft_s:
            return None
        return (self.tokens - 1) / (self.total_s - self.ttft_s)


def normalize_url(url: str, option: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{option} {url!r} is not an http(s) URL", tip="e.g. http://127.0.0.1:8080")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


def _conn(base: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(base)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname or "", parts.port, timeout=timeout), parts.path


def _get_json(base: str, path: str, timeout: float) -> tuple[int, Any]:
    """(HTTP status, the JSON body or None when it is not JSON); raises OSError when the server is not reached."""
    conn, prefix = _conn(base, timeout)
    try:
        conn.request("GET", prefix + path)
        resp = conn.getresponse()
        body = resp.read()
        try:
            return resp.status, json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return resp.status, None
    finally:
        conn.close()


def discover(arm: str, url: str, model: str | None, option: str) -> Server:
    """Reach the server (GET /v1/models) and pick the model name (``model``, else the first listed, else none: the
    server's default; mlx_lm.server lists only models in the HF cache)."""
    base = normalize_url(url, option)
    try:
        status, listing = _get_json(base, "/v1/models", 30)
    except (OSError, http.client.HTTPException) as exc:
        raise UsageError(
            f"{option}: the {arm} server at {base} does not answer GET /v1/models ({exc})",
            tip="start the server, or check the host and port",
        ) from exc
    if status >= 500:
        raise UsageError(
            f"{option}: the {arm} server at {base} answers GET /v1/models with HTTP {status}",
            tip="check the server's log",
        )
    data = listing.get("data") if isinstance(listing, dict) else None
    ids = (
        [m.get("id") for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if isinstance(data, list)
        else []
    )
    return Server(arm=arm, base=base, model=model or (ids[0] if ids else None))


def _payload(
    server: Server, prompt: PromptSpec, *, max_tokens: int, stream: bool, logprobs: bool
) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "seed": SEED, "stream": stream}
    if server.model:
        body["model"] = server.model
    if stream:
        body["stream_options"] = {"include_usage": True}
    if logprobs:
        body["logprobs"] = True
    if prompt.messages is not None:
        body["messages"] = [{"role": r, "content": c} for r, c in prompt.messages]
        return "/v1/chat/completions", body
    body["prompt"] = prompt.text
    return "/v1/completions", body


def _choice_text(choice: dict[str, Any]) -> str:
    if "text" in choice and isinstance(choice["text"], str):
        return choice["text"]
    msg = choice.get("delta") or choice.get("message") or {}
    content = msg.get("content") if isinstance(msg, dict) else None
    return content if isinstance(content, str) else ""


def _logprobs_of(choice: dict[str, Any]) -> tuple[list[float], list[Any]] | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if isinstance(lp.get("content"), list):  # chat (OpenAI) and mlx_lm.server for both endpoints
        vals = [c.get("logprob") for c in lp["content"] if isinstance(c, dict)]
        ids = [c.get("id", c.get("token")) for c in lp["content"] if isinstance(c, dict)]
        return [float(v) for v in vals if isinstance(v, (int, float))], ids
    if isinstance(lp.get("token_logprobs"), list):  # legacy completions
        return [float(v) for v in lp["token_logprobs"] if isinstance(v, (int, float))], list(
            lp.get("tokens") or []
        )
    return None


def request(
    server: Server, prompt: PromptSpec, *, max_tokens: int, stream: bool, logprobs: bool, timeout: float
) -> Reply:
    """One request; never raises for a server-side problem (the Reply says what went wrong)."""
    path, body = _payload(server, prompt, max_tokens=max_tokens, stream=stream, logprobs=logprobs)
    conn, prefix = _conn(server.base, timeout)
    t0 = time.perf_counter()
    try:
        conn.request(
            "POST", prefix + path, body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        if resp.status != 200:
            return Reply(
                ok=False, error=f"HTTP {resp.status}: {resp.read()[:300]!r}", total_s=time.perf_counter() - t0
            )
        if not stream:
            data = json.loads(resp.read())
            choice = (data.get("choices") or [{}])[0]
            got = _logprobs_of(choice)
            usage = (data.get("usage") or {}).get("completion_tokens")
            return Reply(
                ok=True,
                text=_choice_text(choice),
                tokens=int(usage or 0),
                logprobs=got[0] if got else None,
                token_ids=got[1] if got else None,
                total_s=time.perf_counter() - t0,
            )
        return _read_stream(resp, t0)
    except (OSError, http.client.HTTPException, json.JSONDecodeError, ValueError) as exc:
        return Reply(ok=False, error=f"{type(exc).__name__}: {exc}", total_s=time.perf_counter() - t0)
    finally:
        conn.close()


def _read_stream(resp: http.client.HTTPResponse, t0: float) -> Reply:
    text, times, usage = [], [], None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"].get("completion_tokens")
        for choice in chunk.get("choices") or []:
            piece = _choice_text(choice)
            if piece:
                text.append(piece)
                times.append(time.perf_counter())
    end = time.perf_counter()
    if not times:
        return Reply(ok=True, text="", tokens=int(usage or 0), total_s=end - t0)
    return Reply(
        ok=True,
        text="".join(text),
        tokens=int(usage or len(times)),
        ttft_s=times[0] - t0,
        itl_s=[b - a for a, b in itertools.pairwise(times)],
        total_s=times[-1] - t0,
    )
