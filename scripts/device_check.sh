#!/usr/bin/env bash
# Device census of SGLang + ExLlamaV3 on one NVIDIA GPU with no network (fits one H200 in 15 minutes): see
# scripts/device_check.py and docs/benchmarks.md, "Device run".
#   bash scripts/device_check.sh                    # = run: on the GPU machine (python3 there holds CUDA torch), <= 9 min
#   bash scripts/device_check.sh prepare            # here: stage artifacts and wheels, print the carry list
#   bash scripts/device_check.sh run --dry-run      # CPU: the same run in the CPU test arms
#   bash scripts/device_check.sh plan sglang        # the plan resolved against the series as it is
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 0 ] && set -- run
PY="${PYTHON:-python3}"
# here (prepare, plan, dry run) the project's venv has overlay's dependencies; on the GPU machine python3 has them
if [ -x .venv/bin/python ] && { [ "$1" = prepare ] || [ "$1" = plan ] || [[ " $* " == *" --dry-run "* ]]; }; then
  PY=.venv/bin/python
fi
exec "$PY" scripts/device_check.py "$@"
