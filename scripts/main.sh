#!/usr/bin/env bash
# The main job on a fresh machine (README's first command):
#   set up (.venv with overlay and its check extra; Debian OpenBLAS so mlx on CPU is not 20x slower), build the patched mlx-lm wheel,
#   print its provenance, then check it against stock mlx-lm on the bundled tiny models.
# Extra arguments go to `overlay check` (e.g. --reps 3).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" = x86_64 ] && [ ! -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq libopenblas0-pthread >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq libopenblas0-pthread >/dev/null; fi
fi
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[check]'  # check needs the [check] extra
wheel=$(.venv/bin/overlay -q apply mlx-lm | tail -n 1)  # one path per pinned artifact, the primary last
.venv/bin/overlay provenance "$wheel"
exec .venv/bin/overlay check mlx-lm "$@"
