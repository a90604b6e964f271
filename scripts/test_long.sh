#!/usr/bin/env bash
# The long tests the default suite leaves out (marker `long`), e.g. `overlay check sglang` on the CPU engine path
# (~15 minutes on 2 cores) and the torch census tests in tests/census/ (SGLang, ExLlamaV3, the gate self-tests
# through ExLlamaV3: ~5 minutes). Same setup as scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./scripts/test.sh -m long "$@"
