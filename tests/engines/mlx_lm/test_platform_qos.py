"""macOS QoS pin: the call a Mac would make, a no-op on this platform, the env switch, and the entry points.

The real ``pthread_set_qos_class_self_np`` exists only on macOS; here the probe fakes ``sys.platform`` and the libc
loader and records the arguments. Both arms generate the same tokens (the pin never changes outputs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROBE = Path(__file__).parent / "probes" / "platform_qos.py"


def test_qos_pin(arms: Any, tmp_path: Path) -> None:
    stock = arms.stock.run_json(PROBE, {"root": str(tmp_path)})
    patched = arms.patched.run_json(PROBE, {"root": str(tmp_path)})
    assert not stock["has_qos"] and patched["has_qos"]
    assert stock["tokens"] == patched["tokens"]
    # Off macOS: nothing happens.
    assert patched["linux"] is False
    assert patched["linux_bad_setting"] is False, "an unknown MLX_LM_QOS must be ignored off macOS"
    assert patched["priority"][0] == patched["priority"][1]
    # On macOS: USER_INTERACTIVE (0x21) by default, USER_INITIATED (0x19) on request, no call when off.
    by_setting = {s: (ret, [tuple(c) for c in calls]) for s, ret, calls in patched["fake_darwin"]}
    assert by_setting[None] == (True, [(0x21, 0)])
    assert by_setting["user-interactive"] == (True, [(0x21, 0)])
    assert by_setting["user-initiated"] == (True, [(0x19, 0)])
    assert by_setting["off"] == (False, [])
    assert (
        patched["bad_setting"]
        and "turbo" in patched["bad_setting"]
        and "user-interactive" in patched["bad_setting"]
    )
    # Pinned where generation runs: the CLI entry points and the server's generation thread.
    assert patched["entry_points"] == {
        "generate.main": True,
        "chat.main": True,
        "benchmark.main": True,
        "server._run_generate": True,
    }
