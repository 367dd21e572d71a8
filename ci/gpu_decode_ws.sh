#!/usr/bin/env bash
# The GPU calls of the Gluon decode (portattn/kernels/decode_ws.py; perf-notes row 121; issue 37's
# short rows). Session 47's H100 run of ci/gluon_decode_ab.py: packed K/V and pages that hold
# whole key tiles gave the shipped decode's bits at 1.3-2x its TB/s (B1-B64); pages smaller than
# the tile differed (fixed since, CPU-checked: tests/test_decode_ws.py's compile test).
#   bash ci/gpu_decode_ws.sh ab      # carry .fa4 (~7 min): the kernel's GPU tests (bits against
#                                    # the shipped decode, pages 16/64/256, odd lengths), then
#                                    # ci/gluon_decode_ab.py (B1, B8; then B64, B256, append16,
#                                    # GQA 8/1, d64), FA4 det paged beside it
#   bash ci/gpu_decode_ws.sh ship    # (~9 min) with ci/patches/decode_ws_on.diff applied here
#                                    # (the sm90 d64 / d128 entries select it): golden refresh of
#                                    # sm90 (every case must say "same bits"; the entries'
#                                    # configuration hashes change), verify in a second process,
#                                    # then the decode paths' GPU tests
#   bash ci/gpu_decode_ws.sh bench   # carry .fa4 (~5 min), patched: the decode benchmark
#                                    # (docs/bench-decode-<card>.*) and transformers_llama
# Before `ship` lands: on the CPU, `git apply ci/patches/decode_ws_on.diff` and `python -m
# ci.golden_dev fingerprints --update --family sm90` under Triton 3.6 and 3.9 (the decode
# stage's machine code changes), then copy the returned golden/sm90.json in.
set -uo pipefail
PART=${1:?usage: bash ci/gpu_decode_ws.sh ab|ship|bench}
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
# The sm90 d64 / d128 entries with decode_ws set: patched here, or already in the tree (the CPU
# step above done first, as `ship` wants: its refresh then finds the fingerprints recorded).
decode_ws_on() {
  local patch=ci/patches/decode_ws_on.diff
  if git apply --check "$patch" 2>/dev/null; then
    git apply "$patch" && echo "decode_ws on (patched on the device)"
  elif git apply -R --check "$patch" 2>/dev/null; then
    echo "decode_ws on (in the tree)"
  else
    echo "$patch applies neither way"; exit 2
  fi
}
if [ "$PART" = ab ]; then
  gpu_setup fa4
  step tests 150 python3 -m pytest tests/test_decode_ws.py -n 8 -p no:cacheprovider \
    -W ignore::DeprecationWarning -rfE -q
  tail -n 4 "$OUT/tests.log"
  step ab_quick 150 python3 ci/gluon_decode_ab.py --quick
  grep -E "^\||Error" "$OUT/ab_quick.log" | head -n 30
  step ab 240 python3 ci/gluon_decode_ab.py
  grep -E "^\|" "$OUT/ab.log" | tail -n +3
elif [ "$PART" = ship ]; then
  gpu_setup
  decode_ws_on
  step refresh 200 python3 -m ci.golden_dev refresh --family sm90
  cp golden/sm90.json "$OUT/"
  tail -n 40 "$OUT/refresh.log"
  step verify 120 python3 -m portattn golden verify --family sm90
  tail -n 4 "$OUT/verify.log"
  step tests "${TEST_LIMIT:-230}" python3 -m pytest tests/test_kvcache.py tests/test_rollout_gpu.py \
    tests/test_key_chunk.py tests/test_cuda_graphs.py tests/test_kvcache_replay.py \
    tests/test_page_block.py tests/test_append.py tests/test_direct_calls.py \
    tests/test_forward_replay.py tests/test_decode_ws.py -n 12 -p no:cacheprovider \
    -W ignore::DeprecationWarning -rfE -q
  tail -n 4 "$OUT/tests.log"
elif [ "$PART" = bench ]; then
  gpu_setup fa4
  decode_ws_on
  step decode 300 python3 benchmarks/bench.py --decode --docs
  cp docs/bench-decode-* "$OUT/"  # the tree's copy stays on the device
  grep -E "^\|" "$OUT/decode.log" | head -n 24
  step llama 200 python3 benchmarks/transformers_llama.py
  grep -E "^\|" "$OUT/llama.log" | tail -n 12
fi
printf '%s\n' "${summary[@]}"
