"""Probe: the macOS QoS pin of the generation threads (mlx_lm.qos), in either arm.

Payload: {"root": models folder}. Returns {"has_qos": bool, "tokens": greedy tokens of a tiny llama,
"priority": (before, after) process niceness around set_thread_qos, "linux": result on this platform, "fake_darwin":
[(setting, returned, calls)], "bad_setting": error text, "entry_points": {name: called in the right thread}}.
On macOS itself the real call is made; here ``sys.platform`` and the libc loader are replaced by fakes that record the
arguments, which is what the test asserts on.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import Any

from fused_common import ensure_model, greedy_tokens, load, prompt_tokens
from probe_io import emit, log, read_payload


class _FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

        def pthread_set_qos_class_self_np(qos_class: int, relpri: int) -> int:
            self.calls.append((qos_class, relpri))
            return 0

        self.pthread_set_qos_class_self_np = _Fn(pthread_set_qos_class_self_np)


class _Fn:
    """Accepts the argtypes/restype assignments a ctypes function gets."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _entry_points(qos: Any) -> dict[str, bool]:
    called: dict[str, bool] = {}
    real = qos.set_thread_qos

    def make_recorder(name: str, thread: threading.Thread | None = None) -> Any:
        def recorder() -> bool:
            called[name] = thread is None or threading.current_thread() is thread
            return False

        return recorder

    # generate.main / server import it at call time; chat and benchmark at module level.
    for name, mod_name, argv in (
        (
            "generate.main",
            "mlx_lm.generate",
            ["mlx_lm.generate", "--model", "/nonexistent/model", "--prompt", "x"],
        ),
        ("chat.main", "mlx_lm.chat", ["mlx_lm.chat", "--model", "/nonexistent/model"]),
        ("benchmark.main", "mlx_lm.benchmark", ["mlx_lm.benchmark", "--model", "/nonexistent/model"]),
    ):
        called[name] = False
        mod: Any = importlib.import_module(mod_name)
        recorder = make_recorder(name)
        qos.set_thread_qos = recorder
        if hasattr(mod, "set_thread_qos"):
            mod.set_thread_qos = recorder
        saved_argv = sys.argv
        sys.argv = argv
        try:
            mod.main()
        except (SystemExit, OSError, ValueError) as e:  # no such model: main stops after the pin
            log(f"{name}: stopped as expected: {type(e).__name__}")
        finally:
            sys.argv = saved_argv
            qos.set_thread_qos = real
            if hasattr(mod, "set_thread_qos"):
                mod.set_thread_qos = real

    from mlx_lm.server import ResponseGenerator

    class _Gen:
        _generation_failed = False

        def _generate(self) -> None:
            pass

    t = threading.Thread(target=lambda: ResponseGenerator._run_generate(gen))
    gen = _Gen()
    qos.set_thread_qos = make_recorder("server._run_generate", t)
    called["server._run_generate"] = False
    try:
        t.start()
        t.join()
    finally:
        qos.set_thread_qos = real
    return called


def main() -> None:
    p = read_payload()
    res: dict[str, Any] = {"version": 1}
    model = load(ensure_model(p["root"], "llama"))
    res["tokens"] = greedy_tokens(model, prompt_tokens(0, 16), 24)
    try:
        qos: Any = importlib.import_module("mlx_lm.qos")
    except ImportError:
        res["has_qos"] = False
        emit(res)
        return
    res["has_qos"] = True
    before = os.getpriority(os.PRIO_PROCESS, 0)
    res["linux"] = qos.set_thread_qos()
    # A setting meant for macOS must not break Linux (shared shell profiles, containers).
    os.environ["MLX_LM_QOS"] = "turbo"
    try:
        res["linux_bad_setting"] = qos.set_thread_qos()
    except ValueError as e:
        res["linux_bad_setting"] = f"ValueError: {e}"
    finally:
        os.environ.pop("MLX_LM_QOS", None)
    res["priority"] = [before, os.getpriority(os.PRIO_PROCESS, 0)]

    fake_darwin = []
    real_platform, real_libc = sys.platform, qos._libc
    try:
        sys.platform = "darwin"
        for setting in (None, "user-interactive", "user-initiated", "off"):
            libc = _FakeLibc()
            qos._libc = lambda libc=libc: libc
            if setting is None:
                os.environ.pop("MLX_LM_QOS", None)
            else:
                os.environ["MLX_LM_QOS"] = setting
            fake_darwin.append([setting, qos.set_thread_qos(), libc.calls])
        os.environ["MLX_LM_QOS"] = "turbo"
        try:
            qos.set_thread_qos()
            res["bad_setting"] = None
        except ValueError as e:
            res["bad_setting"] = str(e)
    finally:
        sys.platform, qos._libc = real_platform, real_libc
        os.environ.pop("MLX_LM_QOS", None)
    res["fake_darwin"] = fake_darwin
    res["entry_points"] = _entry_points(qos)
    emit(res)


if __name__ == "__main__":
    main()
