"""Facts about the machine a check ran on, for the report: speed numbers mean little without them."""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overlay.check.envs import Arm

_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return platform.processor() or None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "cpu model"):
            return value.strip() or None
    return platform.processor() or None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def host_facts() -> dict[str, Any]:
    """CPU model, logical cores (and those this process may use), load average, OS and Python."""
    try:
        usable: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "load_average_start": load_average(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def requirement_names(requirements: Sequence[str]) -> list[str]:
    """Distribution names of requirement strings (``mlx[cpu]==0.32.4`` -> ``mlx``)."""
    out = []
    for r in requirements:
        m = _REQ_NAME.match(r)
        if m and m.group(1) not in out:
            out.append(m.group(1))
    return out


_VERSIONS = """
import json, sys
from importlib import metadata
out = {}
for name in json.loads(sys.stdin.read()):
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def backend_versions(arm: Arm, names: Sequence[str]) -> dict[str, str | None]:
    """The installed version of each distribution in ``arm`` (the engine and its runtime requirements); an empty
    mapping when the arm's interpreter cannot say (the report then has no versions, rather than a failed check)."""
    proc = arm.run(["-c", _VERSIONS], input=json.dumps(list(names)), timeout=120)
    if proc.returncode != 0:
        return {}
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {}
    return {str(k): (None if v is None else str(v)) for k, v in data.items()}
