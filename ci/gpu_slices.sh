#!/usr/bin/env bash
# The decode's query heads spread over programs at small batches (decode.heads_per_tile,
# perf-notes row 119): the A/B of ci/head_slices_ab.py (carry .fa4), then golden verify of
# sm90 (its small-batch decode cases now run sliced: same bits expected) and the decode ==
# prefill GPU tests, with the slicing switched on in the device's copy. One call, ~7 min:
#   bash ci/gpu_slices.sh   (carry .fa4)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup fa4
# Slicing on in this (device) copy of the checkout: it ships off (SLICE_BELOW_PROGRAMS = 0)
# until this call's numbers and bits say otherwise; verify and the tests then run it.
sed -i 's/^SLICE_BELOW_PROGRAMS = 0$/SLICE_BELOW_PROGRAMS = SPLIT_BELOW_PROGRAMS/' \
  portattn/kernels/decode.py
grep -n "^SLICE_BELOW_PROGRAMS" portattn/kernels/decode.py
step slices "${SLICES_LIMIT:-300}" python3 ci/head_slices_ab.py ${SLICES_ARGS:-}
grep -E "^\|" "$OUT/slices.log" | tail -n 80; tail -n 5 "$OUT/slices.log" | grep -v "^|"
step_tail verify 90 3 python3 -m portattn golden verify --family sm90
step_tail tests "${TEST_LIMIT:-200}" 8 python3 -m pytest ${TESTS:-tests/test_kvcache.py \
  tests/test_rollout_gpu.py tests/test_key_chunk.py tests/test_kvcache_replay.py \
  tests/test_page_block.py tests/test_append.py tests/test_head_slices.py} \
  -n 12 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
printf '%s\n' "${summary[@]}"
