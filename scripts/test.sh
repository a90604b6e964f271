#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh machine (README's second command; .ci/run calls this).
#   - Debian packages the tests use: git, OpenBLAS (mlx on CPU), Chromium (HTML report tests).
#   - a virtualenv at .venv with the project and its check, test and dev extras;
#   - ruff check and ruff format --check, mypy (strict on src and tests: pyproject's [tool.mypy]), the import-layer contract, the JSON
#     Schemas up to date, the tool's wheel built and checked with check-wheel-contents; any failing fails the run;
#   - pytest over tests/ (GPU-only tests are deselected: they run from scripts/device/; `long` ones: scripts/test_long.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v git >/dev/null || need+=(git)
[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 ] || [ "$(uname -m)" != x86_64 ] || need+=(libopenblas0-pthread)
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[check,test,dev]'
.venv/bin/ruff check src tests scripts support
.venv/bin/ruff format --check src tests scripts support
.venv/bin/mypy
.venv/bin/mypy tests/engines/sglang/conftest.py  # the engines' conftest.py, each alone: each is the module `conftest`
.venv/bin/mypy tests/engines/mlx_lm/conftest.py  # (pyproject's [tool.mypy] exclude says why)
.venv/bin/mypy tests/engines/vllm/conftest.py
.venv/bin/lint-imports --no-cache                 # the layers (docs/dev/architecture.md)
.venv/bin/python -m overlay.schemas --check      # the shipped JSON Schemas match the document types
rm -rf build/dist && .venv/bin/python -m build --wheel --outdir build/dist . >/dev/null
.venv/bin/check-wheel-contents build/dist/*.whl   # the tool's own wheel: no stand-ins, fixtures or strays
if [ $# -gt 0 ] && [ "$1" = "-m" ]; then exec .venv/bin/pytest "$@"; fi
exec .venv/bin/pytest -m "not gpu and not long" "$@"
