"""`overlay check --endpoints`: two OpenAI-compatible servers side by side.

The fast tests run two small in-process HTTP servers that speak the OpenAI streaming protocol (a stand-in for a
server, labelled as such); the long test starts two real `mlx_lm.server` processes (the stock and the patched wheel's
venvs) on a bundled tiny model on loopback, with bounded requests and time.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from overlay.check.endpoints import EndpointOptions, run_endpoints
from overlay.check.endpoints_client import normalize_url
from overlay.errors import CheckFailed, UsageError

REPO = Path(__file__).resolve().parents[2]


def _words(prompt: str, n: int, *, diverge: bool) -> list[str]:
    base = [f"w{(sum(map(ord, prompt)) * (i + 1)) % 97}" for i in range(n)]
    if diverge and "prime" in prompt:
        base[n // 2] = "DIFFERENT"
    return [" " + w for w in base]


def _server(
    *, diverge: bool = False, lp_offset: float = 0.0, delay: float = 0.001, calls: list[str] | None = None
) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _json(self, obj: Any, code: int = 200) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._json({"data": [{"id": "stand-in"}]}) if self.path == "/v1/models" else self._json({}, 404)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if calls is not None:
                calls.append(self.path)
            chat = self.path == "/v1/chat/completions"
            prompt = body["messages"][-1]["content"] if chat else body["prompt"]
            words = _words(prompt, body["max_tokens"], diverge=diverge)

            def choice(text: str) -> dict[str, Any]:
                return {
                    "index": 0,
                    "delta" if body.get("stream") and chat else "message" if chat else "text": {
                        "content": text
                    }
                    if chat
                    else text,
                }

            if not body.get("stream"):
                c = choice("".join(words))
                if body.get("logprobs"):
                    c["logprobs"] = {
                        "content": [
                            {"id": i, "logprob": -0.5 - 0.01 * i + lp_offset} for i in range(len(words))
                        ]
                    }
                self._json({"choices": [c], "usage": {"completion_tokens": len(words)}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for w in words:
                time.sleep(delay)
                self.wfile.write(f"data: {json.dumps({'choices': [choice(w)]})}\n\n".encode())
                self.wfile.flush()
            if (body.get("stream_options") or {}).get("include_usage"):
                self.wfile.write(
                    f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': len(words)}})}\n\n".encode()
                )
            self.wfile.write(b"data: [DONE]\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture
def pair() -> Iterator[tuple[ThreadingHTTPServer, ThreadingHTTPServer]]:
    a, b = _server(), _server(delay=0.002)
    yield a, b
    a.shutdown()
    b.shutdown()


def _opts(tmp_path: Path, a: str, b: str, **kw: Any) -> EndpointOptions:
    return EndpointOptions(
        stock_url=a,
        patched_url=b,
        json_path=tmp_path / "e.json",
        html_path=tmp_path / "e.html",
        **{"requests": 8, "concurrency": 2, "max_tokens": 12, **kw},
    )


def test_identical_servers_pass_with_latency_percentiles(tmp_path: Path, pair: Any) -> None:
    a, b = pair
    rep = run_endpoints(root=tmp_path, options=_opts(tmp_path, _url(a), _url(b) + "/v1/"))
    assert rep["verdict"] == "pass" and rep["identity"]["identical_count"] == 4
    assert (
        rep["identity"]["logprobs"]["max_abs_diff"] == 0.0 and rep["identity"]["logprobs"]["positions"] == 48
    )
    ld = rep["load"]
    assert ld["rounds"] == 4 and ld["arms"]["stock"]["requests"] == ld["arms"]["patched"]["requests"] == 8
    for arm in ("stock", "patched"):
        m = ld["arms"][arm]
        assert m["failed"] == 0 and m["output_tokens"] == 8 * 12
        assert m["ttft_s"]["n"] == 8 and m["itl_s"]["n"] == 8 * 11 and m["output_tok_s"]["p50"] > 0
        assert m["ttft_s"]["p50"] <= m["ttft_s"]["p90"] <= m["ttft_s"]["p99"]
    # the patched stand-in sleeps twice as long per token: its tok/s is lower, and the ratio says so
    assert ld["arms"]["patched"]["itl_s"]["p50"] > ld["arms"]["stock"]["itl_s"]["p50"]
    assert ld["ratio"]["output_tok_s"]["ratio"] < 1 and ld["ratio"]["output_tok_s"]["better"] == "higher"
    assert ld["ratio"]["ttft"]["better"] == "lower"
    on_disk = json.loads((tmp_path / "e.json").read_text())
    assert (
        on_disk["servers"]["patched"]["url"] == _url(b) and on_disk["servers"]["stock"]["model"] == "stand-in"
    )
    assert "Greedy identity" in (tmp_path / "e.html").read_text()


def test_chat_prompts_use_chat_completions_and_the_arms_alternate(tmp_path: Path) -> None:
    calls_a: list[str] = []
    a, b = _server(calls=calls_a), _server()
    try:
        run_endpoints(root=tmp_path, options=_opts(tmp_path, _url(a), _url(b), requests=4, concurrency=1))
    finally:
        a.shutdown()
        b.shutdown()
    assert "/v1/chat/completions" in calls_a and "/v1/completions" in calls_a


def test_a_divergent_server_fails_greedy_identity(tmp_path: Path) -> None:
    a, b = _server(), _server(diverge=True, lp_offset=0.25)
    try:
        with pytest.raises(CheckFailed, match="greedy output identical per prompt: 3/4") as exc:
            run_endpoints(root=tmp_path, options=_opts(tmp_path, _url(a), _url(b)))
    finally:
        a.shutdown()
        b.shutdown()
    assert exc.value.return_code == 4
    rep = json.loads((tmp_path / "e.json").read_text())
    row = next(r for r in rep["identity"]["rows"] if not r["identical"])
    assert row["category"] == "chat" and "DIFFERENT" in row["patched_text"]
    assert rep["identity"]["logprobs"]["max_abs_diff"] == pytest.approx(0.25)


def test_time_limit_bounds_the_load_phase(tmp_path: Path) -> None:
    a, b = _server(delay=0.02), _server(delay=0.02)
    try:
        rep = run_endpoints(
            root=tmp_path,
            options=_opts(tmp_path, _url(a), _url(b), requests=40, concurrency=2, time_limit_s=0.5),
        )
    finally:
        a.shutdown()
        b.shutdown()
    ld = rep["load"]
    assert ld["stopped_by_time_limit"] and ld["rounds"] < 20
    assert ld["arms"]["stock"]["requests"] == ld["arms"]["patched"]["requests"]  # same rounds per arm
    assert any("--time-limit" in n for n in rep["notes"])


def test_unreachable_server_and_bad_urls_are_usage_errors(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UsageError, match="does not answer GET /v1/models") as exc:
        run_endpoints(
            root=tmp_path, options=_opts(tmp_path, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}")
        )
    assert exc.value.return_code == 2 and not (tmp_path / "e.json").exists()
    with pytest.raises(UsageError, match="is not an http"):
        normalize_url("localhost:8000", "STOCK_URL")
    with pytest.raises(UsageError, match="--concurrency 0"):
        run_endpoints(root=tmp_path, options=_opts(tmp_path, "http://x", "http://y", concurrency=0))


def test_cli_endpoints_prints_the_table(cli: Any, tmp_path: Path, pair: Any) -> None:
    a, b = pair
    r = cli(
        "--root",
        str(REPO),
        "check",
        "--endpoints",
        _url(a),
        _url(b),
        "--requests",
        "4",
        "--concurrency",
        "2",
        "--max-tokens",
        "6",
        "--json",
        str(tmp_path / "c.json"),
        "--html",
        str(tmp_path / "c.html"),
    )
    assert r.code == 0, r.err
    assert "overlay check --endpoints: PASS" in r.out and "TTFT p50" in r.out and "tok/s p50" in r.out
    r2 = cli("--root", str(REPO), "check", "mlx-lm", "--endpoints", _url(a), _url(b))
    assert r2.code == 2 and "drop the ENGINE argument" in r2.err


# ------------------------------------------------------------------ real mlx_lm.server processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[str], deadline: float) -> None:
    import urllib.request

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"mlx_lm.server exited {proc.returncode}: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
            )
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} not ready in time")


@pytest.mark.long
@pytest.mark.network
def test_two_real_mlx_lm_servers_stock_and_patched(tmp_path: Path) -> None:
    from overlay.check import models as tinymodels
    from overlay.check.envs import arm_env
    from overlay.core.build import apply_engine
    from overlay.core.fetch import fetch_artifact
    from overlay.core.manifest import load_engine

    manifest = load_engine(REPO, "mlx-lm")
    stock = arm_env(REPO, manifest, fetch_artifact(REPO, manifest, manifest.upstream.primary), name="stock")
    patched = arm_env(REPO, manifest, apply_engine(root=REPO, engine="mlx-lm").wheel, name="patched")
    model = tinymodels.build("llama-random", root=REPO, python=stock.python)
    procs = []
    urls = []
    try:
        for arm in (stock, patched):
            port = _free_port()
            env = {**__import__("os").environ, **arm.env}
            procs.append(
                subprocess.Popen(
                    [
                        str(arm.python),
                        "-m",
                        "mlx_lm.server",
                        "--model",
                        str(model),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                    ],
                    env=env,
                    text=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 240
        for url, proc in zip(urls, procs):
            _wait_ready(url, proc, deadline)
        prompts = tmp_path / "p.jsonl"
        prompts.write_text(
            "\n".join(
                json.dumps({"text": t, "category": c})
                for c, t in (
                    ("code", "def add(a, b):"),
                    ("prose", "Once upon a time"),
                    ("list", "1. apples\n2."),
                )
            )
            + "\n"
        )
        t0 = time.monotonic()
        rep = run_endpoints(
            root=tmp_path,
            options=EndpointOptions(
                stock_url=urls[0],
                patched_url=urls[1],
                prompts_file=prompts,
                requests=6,
                concurrency=2,
                max_tokens=16,
                time_limit_s=120,
                json_path=tmp_path / "e.json",
                html_path=tmp_path / "e.html",
            ),
        )
        assert time.monotonic() - t0 < 300
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    assert rep["identity"]["identical"], rep["identity"]["rows"]
    assert rep["identity"]["logprobs"] is not None and rep["identity"]["logprobs"]["positions"] > 0
    for side in ("stock", "patched"):
        m = rep["load"]["arms"][side]
        assert m["failed"] == 0 and m["ttft_s"]["n"] == 6 and m["output_tok_s"]["p50"] > 0
