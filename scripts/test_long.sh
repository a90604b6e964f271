#!/usr/bin/env bash
# The long tests the default suite leaves out (marker `long`), e.g. `overlay check sglang` on the CPU engine path
# (~15 minutes on 2 cores), the torch census tests in tests/census/ (SGLang, ExLlamaV3, the gate self-tests
# through ExLlamaV3: ~5 minutes; since stop 32 ExLlamaV3's alone ~5 minutes, with its drafter-load, prefill-chunk,
# verify-mlp and MTP-drafter runs), the vLLM engine runs (tests/engines/vllm), and since stop 27 the heaviest runs that
# kept the default suite over 25 minutes on 2 cores: the mlx-lm check on the shipped series (~7 minutes; README's
# first command runs it), the mlx-lm MTP reference, trained-head and sampled-speculation runs, SGLang's engine runs
# (tests/engines/sglang/test_engine.py) and all-reduce reference, ExLlamaV3's Q8 ring and static-table ring runs, the
# mechanism-gate self-test; since stop 28 the trained qwen3_5-mtp build (tests/tinymodels, 115 s) and ExLlamaV3's
# SharedKVAttention ring run (45 s), which took the default suite to 26 minutes; since stop 29 SGLang's 0012 graph
# epilogue run (tests/engines/sglang/test_cuda_graph.py, ~100 s) and mlx-lm 0029's real-model stall run
# (tests/engines/mlx_lm/test_spec_stall.py); the mlx-lm sampled-speculation runs on the hybrid target and with the
# MTP head (tests/engines/mlx_lm/test_spec_sampling_hybrid.py and test_spec_sampling_mtp.py, ~3 minutes each);
# ExLlamaV3's full compile of every unit the series recompiles and of the EXL3_OVL_BSZN=16 units
# (tests/engines/exllamav3/test_exl3_compile.py, ~25 min on 2 loaded cores) and its device script's dry run
# (test_exl3_device.py, ~10 min); ExLlamaV3's ring schedules on upstream's Triton kernels in Triton's interpreter
# (test_exl3_drafter_kv.py, ~2 min); the vLLM device check's dry run (tests/check/test_device_vllm.py, ~20 s, plus
# ~1 min and the CUDA wheel's download the first time: it prepares the carry). Same setup as scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./scripts/test.sh -m long "$@"
