#!/usr/bin/env bash
# ExLlamaV3 device census alone (scripts/device_check.sh runs it with SGLang; see docs/benchmarks.md, "Device run").
# From the repository root, on the GPU machine:
#   python3 scripts/device_check.py plan exllamav3 > build/device/plan-exllamav3.json
#   bash scripts/device/exllamav3_check.sh --plan build/device/plan-exllamav3.json --stock WHEEL --patched WHEEL
#       [--phase build|probes|all] [--budget S]    # build: stock ext once, then only the changed units
#   bash scripts/device/exllamav3_check.sh --dry-run --plan ...     # CPU: stand-in extension, the CPU census
# The machine needs a Python with CUDA torch, triton, numpy, safetensors, tokenizers, pydantic, marisa_trie, rich,
# pyyaml, pillow and nvcc (no network: carry wheels, see scripts/device_check.py prepare).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
exec "$PY" scripts/device/exllamav3_check.py "$@"
