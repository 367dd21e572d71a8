#!/usr/bin/env bash
# The GPU calls of the Gluon decode (portattn/kernels/decode_ws.py; perf-notes row 121; issue 37's
# short rows). Session 47's H100 run of ci/gluon_decode_ab.py: packed K/V and pages that hold
# whole key tiles gave the shipped decode's bits at 1.3-2x its TB/s (B1-B64); pages smaller than
# the tile differed (fixed since, CPU-checked: tests/test_decode_ws.py's compile test).
#   bash ci/gpu_decode_ws.sh ab      # carry .fa4 (~7 min): the kernel's GPU tests (bits against
#                                    # the shipped decode, pages 16/64/256, odd lengths), then
#                                    # ci/gluon_decode_ab.py (B1, B8; then B64, B256, append16,
#                                    # GQA 8/1, d64), FA4 det paged beside it
#   bash ci/gpu_decode_ws.sh split   # carry .fa4 (~5 min): the Gluon split decode
#                                    # (decode.GLUON_SPLIT): the kernel's GPU tests (split
#                                    # bits against the Triton split's included), then
#                                    # ci/gluon_split_ab.py (B1-B8 x 32k, bits and graph TB/s)
#   bash ci/gpu_decode_ws.sh bench   # carry .fa4 (~6 min): the decode benchmark
#                                    # (docs/bench-decode-<card>.*), the eager host time and
#                                    # transformers_llama
# Session 48 ran `ab`, `ship` and `bench` (`ship` removed since: the sm90 d128 entries select
# the Gluon decode in the tree; golden refresh same bits, perf-notes row 122). Session 50 ran
# `split_ship` (removed since: decode.GLUON_SPLIT is on in the tree; golden refresh same bits,
# perf-notes row 124) and `bench`.
set -uo pipefail
PART=${1:?usage: bash ci/gpu_decode_ws.sh ab|split|bench}
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
if [ "$PART" = ab ]; then
  gpu_setup fa4
  step tests 150 python3 -m pytest tests/test_decode_ws.py -n 8 -p no:cacheprovider \
    -W ignore::DeprecationWarning -rfE -q
  tail -n 4 "$OUT/tests.log"
  step ab_quick 150 python3 ci/gluon_decode_ab.py --quick
  grep -E "^\||Error" "$OUT/ab_quick.log" | head -n 30
  step ab 240 python3 ci/gluon_decode_ab.py
  grep -E "^\|" "$OUT/ab.log" | tail -n +3
elif [ "$PART" = split ]; then
  gpu_setup fa4
  step tests 200 python3 -m pytest tests/test_decode_ws.py -n 8 -p no:cacheprovider \
    -W ignore::DeprecationWarning -rfE -q
  tail -n 4 "$OUT/tests.log"
  step split_ab 240 python3 ci/gluon_split_ab.py
  grep -E "^\||Error" "$OUT/split_ab.log"
elif [ "$PART" = bench ]; then
  gpu_setup fa4
  step decode 300 python3 benchmarks/bench.py --decode --docs
  cp docs/bench-decode-* "$OUT/"  # the tree's copy stays on the device
  grep -E "^\|" "$OUT/decode.log" | head -n 24
  # the eager host time per call (issue 37's 30 us; not measured on a GPU since session 29)
  step host 120 python3 benchmarks/host_overhead.py --gpu --n 1000
  grep -E "^\|" "$OUT/host.log"
  step llama 200 python3 benchmarks/transformers_llama.py
  grep -E "^\|" "$OUT/llama.log" | tail -n 12
fi
printf '%s\n' "${summary[@]}"
