"""Probe: start ``mlx_lm.server`` of this arm on a free port, send completion requests, stop it.

Payload: {"args": [server arguments after --model DIR ...], "requests": [{body}, ...], "timeout": seconds}.
Result: {"responses": [{"status", "body"}, ...], "log": last lines of the server's stderr}.
The server is this probe's own child process; it is terminated (by its pid) before the probe exits.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from probe_io import emit, read_payload


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(port: int, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return {"status": resp.status, "body": json.loads(resp.read())}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": json.loads(exc.read() or b"{}")}


def main() -> None:
    payload = read_payload()
    port = _free_port()
    timeout = float(payload.get("timeout", 120))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_lm", "server", "--port", str(port), *payload["args"]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError("server did not start listening") from None
                time.sleep(0.5)
        responses = [_post(port, body, timeout) for body in payload["requests"]]
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    emit({"responses": responses, "log": (err or "").splitlines()[-20:]})


if __name__ == "__main__":
    main()
