#!/usr/bin/env bash
# Session 30's GPU check of the direct launches and the key split's semantics: the GPU tests
# of the launch paths and tests/test_key_chunk.py (the device's entries with key_chunk, on the
# Triton forward), then host times A/B (ci/host_ab.sh: ab_base/ = main 1759810 against this
# tree; make it first: mkdir ab_base && git archive 1759810 portattn benchmarks | tar -x -C
# ab_base).
set -uo pipefail
OUT=${OUT:-/tmp/portattn-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
PYTHONPATH=$PWD step tests "${TEST_LIMIT:-150}" python3 -m pytest ${TESTS:-tests/test_launcher.py \
  tests/test_kvcache_replay.py tests/test_forward_replay.py tests/test_cuda_graphs.py \
  tests/test_append.py tests/test_direct_calls.py tests/test_rollout_gpu.py tests/test_kvcache.py \
  tests/test_key_chunk.py} \
  -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
tail -n 4 "$OUT/tests.log"
CASES=${CASES:-paged,dense,paged_append_t,varlen_nograd,varlen_grad} step host_ab 150 bash ci/host_ab.sh
cat "$OUT/host_ab.log"
printf '%s\n' "${summary[@]}"
