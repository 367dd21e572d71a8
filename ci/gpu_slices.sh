#!/usr/bin/env bash
# The decode's query heads spread over programs at small batches (decode.heads_per_tile,
# perf-notes row 119): the A/B of ci/head_slices_ab.py (carry .fa4), then golden verify of
# sm90 (its small-batch decode cases now run sliced: same bits expected) and the decode ==
# prefill GPU tests. One call, ~7 min:  bash ci/gpu_slices.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup fa4
step slices "${SLICES_LIMIT:-300}" python3 ci/head_slices_ab.py ${SLICES_ARGS:-}
grep -E "^\|" "$OUT/slices.log" | tail -n 80; tail -n 5 "$OUT/slices.log" | grep -v "^|"
step verify 90 python3 -m portattn golden verify --family sm90
tail -n 3 "$OUT/verify.log"
step tests "${TEST_LIMIT:-200}" python3 -m pytest ${TESTS:-tests/test_kvcache.py \
  tests/test_rollout_gpu.py tests/test_key_chunk.py tests/test_kvcache_replay.py \
  tests/test_page_block.py tests/test_append.py tests/test_head_slices.py} \
  -n 12 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
tail -n 8 "$OUT/tests.log"
printf '%s\n' "${summary[@]}"
