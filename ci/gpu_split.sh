#!/usr/bin/env bash
# Session 31's GPU call for the split decode (design §3.1): the GPU tests of the decode paths
# with the new decode kernel signature (a partials argument, None unsplit) and of the key split
# (tests/test_key_chunk.py: the device's entries patched to C = two key tiles), golden verify
# sm90 (no machine code of a shipped entry changed), then ci/split_decode_ab.py (bits, decode
# TB/s at C 2048 / 1024 against shipped entries and FA4, the training forward's cost of C).
set -uo pipefail
OUT=${OUT:-/tmp/portattn-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
[ -f .fa4/install.sh ] && source .fa4/install.sh
step tests "${TEST_LIMIT:-170}" python3 -m pytest ${TESTS:-tests/test_key_chunk.py \
  tests/test_kvcache.py tests/test_kvcache_replay.py tests/test_direct_calls.py \
  tests/test_forward_replay.py tests/test_cuda_graphs.py tests/test_page_block.py} \
  -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
tail -n 4 "$OUT/tests.log"
step golden 150 python3 -m portattn golden verify --family sm90
tail -n 2 "$OUT/golden.log"
step split "${SPLIT_LIMIT:-200}" python3 ci/split_decode_ab.py ${SPLIT_ARGS:-}
sed -n '/## summary/,$p' "$OUT/split.log"
printf '%s\n' "${summary[@]}"
