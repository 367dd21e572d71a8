#!/usr/bin/env bash
# Session 33's GPU call (carry .fa4): the Gluon forward's key chunks with the running
# accumulator parked in a float32 workspace (three ring slots at 128-key tiles, as shipped),
# and where the eager call's host time goes beside FlashAttention-4's.
#   1. tests/test_key_chunk.py (the Gluon merge = the Triton merge at C = one and two key
#      tiles, the entry's own ring) and the forward replay's tests (the workspace travels in
#      the template's partials slot)                                           (~3 min)
#   2. ci/split_variants.py --forward: the training forward with C 1024 / 2048 / 4096 on the
#      Gluon forward against the shipped one, Triton C for reference, Gluon bits = Triton's
#                                                                              (~3 min)
#   3. ci/host_peers.py --profile: host µs per eager call and graph replay, portattn and FA4
#      det, paged decode B1 and a small varlen forward; cProfile of portattn's  (~1 min)
# bash ci/gpu_park.sh forward: 1's Gluon tests and 2 alone (a kernel change's cost)  (~4 min)
set -uo pipefail
PART=${1:-all}
OUT=${OUT:-/tmp/portattn-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$PART" = forward ]; then
  step tests 150 python3 -m pytest tests/test_key_chunk.py -k gluon -n 8 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/tests.log"
  step forward "${FORWARD_LIMIT:-240}" python3 ci/split_variants.py --forward
  sed -n '/## summary/,$p' "$OUT/forward.log"
  printf '%s\n' "${summary[@]}"
  exit 0
fi
step tests "${TEST_LIMIT:-200}" python3 -m pytest tests/test_key_chunk.py \
  tests/test_forward_replay.py -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
tail -n 6 "$OUT/tests.log"
step forward "${FORWARD_LIMIT:-240}" python3 ci/split_variants.py --forward
sed -n '/## summary/,$p' "$OUT/forward.log"
[ -f .fa4/install.sh ] && source .fa4/install.sh
step host 150 python3 ci/host_peers.py --profile --n 1000
sed -n '/## summary/,$p' "$OUT/host.log"
printf '%s\n' "${summary[@]}"
