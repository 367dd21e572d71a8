#!/usr/bin/env bash
# Session 31's GPU calls for the split decode and the Gluon chunk merge (design §3.1), two
# calls (carry .fa4 for the second):
#   bash ci/gpu_split.sh tests   # the GPU tests of the decode paths with the new decode kernel
#                                # signature (a partials argument, None unsplit) and of the key
#                                # split (tests/test_key_chunk.py: entries patched to C = two key
#                                # tiles; the Gluon forward's merge against the Triton one; one
#                                # 32k-key sequence's decode row against its prefill row at
#                                # C = 2048), then golden verify sm90 (shipped bits)  (~6 min)
#   bash ci/gpu_split.sh bench   # ci/split_decode_ab.py: bits, decode TB/s shipped / C split /
#                                # C unsplit / FA4, the training forward's cost of C   (~5 min);
#                                # then host µs per eager call (session 32's kept fold views:
#                                # attention_decode, transformers' decode layout)   (~1 min)
set -uo pipefail
PART=${1:?usage: bash ci/gpu_split.sh tests|bench}
OUT=${OUT:-/tmp/portattn-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
if [ "$PART" = tests ]; then
  step tests "${TEST_LIMIT:-330}" python3 -m pytest ${TESTS:-tests/test_key_chunk.py \
    tests/test_kvcache.py tests/test_kvcache_replay.py tests/test_direct_calls.py \
    tests/test_forward_replay.py tests/test_cuda_graphs.py tests/test_page_block.py \
    tests/test_dense_layout.py} \
    -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 6 "$OUT/tests.log"
  step golden 200 python3 -m portattn golden verify --family sm90
  tail -n 2 "$OUT/golden.log"
else
  [ -f .fa4/install.sh ] && source .fa4/install.sh
  step split "${SPLIT_LIMIT:-470}" python3 ci/split_decode_ab.py ${SPLIT_ARGS:-}
  sed -n '/## summary/,$p' "$OUT/split.log"
  step host 90 python3 benchmarks/host_overhead.py --gpu --n 1000 \
    --cases attention_decode,attention_growing,paged,dense,varlen_nograd
  grep -E "^\| " "$OUT/host.log"
fi
printf '%s\n' "${summary[@]}"
