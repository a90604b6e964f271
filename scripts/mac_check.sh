#!/usr/bin/env bash
# Stock vs patched mlx-lm on an Apple-silicon Mac (Metal): serial vs draft model vs MTP, k = 1..3, T = 0 and 0.7,
# one JSON report (tok/s, acceptance, byte identity at T = 0). See scripts/mac_check.py.
#   scripts/mac_check.sh --model MODEL [--draft-model DRAFT] [--mtp-model MTP_MODEL | --mtp-drafter DRAFTER] [--out FILE.json]
#   scripts/mac_check.sh --model MODEL --dry-run     # the plan only (also on Linux)
# The interpreter: $PYTHON if set, else the repository's .venv/bin/python, else python3; it must be Python >= 3.11
# (checked here, exit 2, before mac_check.py is read: it needs tomllib).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    PY=python3
fi
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "mac_check: no Python interpreter at '$PY'; install Python >= 3.11 or set PYTHON=/path/to/python3.11" >&2
    exit 2
fi
if ! found="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2]); sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null)"; then
    echo "mac_check: needs Python >= 3.11, '$PY' is Python ${found:-of an unknown version}; set PYTHON=/path/to/python3.11 (or create the repository's .venv with it: python3.11 -m venv .venv && .venv/bin/pip install -e .)" >&2
    exit 2
fi
exec "$PY" scripts/mac_check.py "$@"
