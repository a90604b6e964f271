#!/usr/bin/env bash
# ExLlamaV3 device check (see docs/engines/exllamav3.md). On the GPU machine, from the repository root:
#   bash scripts/device/exllamav3_check.sh            # JIT-builds the extension per arm, runs the GPU checks
#   bash scripts/device/exllamav3_check.sh --dry-run  # CPU: stand-in extension, reference kernels
# Needs build/cache (stock wheel) and build/wheels/exllamav3 (patched wheel) carried along, and a Python with
# CUDA torch, triton, numpy, safetensors, tokenizers, pydantic, marisa_trie, rich, pyyaml, pillow (no network).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
exec "$PY" scripts/device/exllamav3_check.py "$@"
