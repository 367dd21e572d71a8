#!/usr/bin/env bash
# The GPU calls that ship the key chunk (design §3.1: C = 16,384 in the sm90 d64 / d128
# entries, perf-notes rows 116-117), after `SM90_KEY_CHUNK = 16384` in portattn/configs/rows.py
# and `python -m ci.golden_dev fingerprints --update --family sm90` under Triton 3.6 and 3.9
# (about 4 minutes each; it adds the 40 chunk stages and marks 23 outputs stale). Two calls,
# the second after copying the first's golden/sm90.json into the checkout (or `all`):
#   bash ci/gpu_chunk_ship.sh refresh   # golden refresh of sm90 (the d64 / d128 entries' new
#                                       # configuration hashes, the two split-decode cases of
#                                       # version 6), then the GPU tests of the key split
#                                       # (the chunk's 20k-key decode == prefill, both
#                                       # kernels, d64 / d128, features, pages 16/64/256) and of
#                                       # the decode paths                       (~5 min)
#   bash ci/gpu_chunk_ship.sh verify    # golden verify sm90 in a process of its own, then the
#                                       # rollout / invariance / CUDA-graph tests  (~4 min)
#   bash ci/gpu_chunk_ship.sh all       # one call: refresh, then verify in a second process
#                                       # on the refreshed file, then the key split's tests
#                                       # and the rollout tests (~9 min; when starts are scarce)
set -uo pipefail
PART=${1:?usage: bash ci/gpu_chunk_ship.sh refresh|verify|all}
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup
if [ "$PART" = all ]; then
  step refresh 200 python3 -m ci.golden_dev refresh --family sm90
  cp golden/sm90.json "$OUT/"
  tail -n 40 "$OUT/refresh.log"
  step verify 120 python3 -m portattn golden verify --family sm90
  tail -n 6 "$OUT/verify.log"
  step tests "${TEST_LIMIT:-230}" python3 -m pytest ${TESTS:-tests/test_key_chunk.py \
    tests/test_kvcache.py tests/test_rollout_gpu.py} \
    -n 12 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 12 "$OUT/tests.log"
elif [ "$PART" = refresh ]; then
  step refresh 240 python3 -m ci.golden_dev refresh --family sm90
  cp golden/sm90.json "$OUT/"
  tail -n 40 "$OUT/refresh.log"
  step tests "${TEST_LIMIT:-300}" python3 -m pytest ${TESTS:-tests/test_key_chunk.py \
    tests/test_kvcache.py tests/test_page_block.py tests/test_append.py} \
    -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 12 "$OUT/tests.log"
else
  step verify 200 python3 -m portattn golden verify --family sm90
  tail -n 6 "$OUT/verify.log"
  step tests "${TEST_LIMIT:-330}" python3 -m pytest ${TESTS:-tests/test_rollout_gpu.py \
    tests/test_invariance_gpu.py tests/test_cuda_graphs.py tests/test_kvcache_replay.py \
    tests/test_direct_calls.py tests/test_forward_replay.py tests/test_unseen_keys.py} \
    -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 12 "$OUT/tests.log"
fi
printf '%s\n' "${summary[@]}"
