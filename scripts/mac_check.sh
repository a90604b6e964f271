#!/usr/bin/env bash
# Stock vs patched mlx-lm on an Apple-silicon Mac (Metal): serial vs draft model vs MTP, k = 1..3, T = 0 and 0.7,
# one JSON report (tok/s, acceptance, byte identity at T = 0). See scripts/mac_check.py.
#   scripts/mac_check.sh --model MODEL [--draft-model DRAFT] [--mtp-model MTP_MODEL] [--out FILE.json]
#   scripts/mac_check.sh --model MODEL --dry-run     # the plan only (also on Linux)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
exec "$PY" scripts/mac_check.py "$@"
