#!/usr/bin/env bash
# GPU arms of `overlay check` on an NVIDIA GPU machine with no network: see scripts/device_check.py.
#   scripts/device_check.sh prepare          # here: stage artifacts/model/wheels, print the carry list
#   scripts/device_check.sh run              # on the GPU machine (python3 there holds CUDA torch); <= 8 minutes
#   scripts/device_check.sh run --dry-run    # CPU: the same harness in the CPU test arms
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
# here (prepare, dry run) the project's venv has overlay's dependencies; on the GPU machine python3 has them
if [ -x .venv/bin/python ] && { [ "${1:-}" = prepare ] || [[ " $* " == *" --dry-run "* ]]; }; then PY=.venv/bin/python; fi
exec "$PY" scripts/device_check.py "$@"
