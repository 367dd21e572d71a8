#!/usr/bin/env bash
# The next session's GPU calls (30 device-minutes a session; a cold start costs 1.5-3 of them).
# Session 24 ran on the H200: the EagerAttention A/B and GPU tests (104 + 519 passed, golden
# verify sm90 30/30), the FA4 comparison of 4 workloads, and branch wip/unseen-keys (its GPU
# tests 18 passed with the slab check, cost +6.6% of a small causal forward replayed).
# What is left:
#   0. issue 35 item 4, from branch wip/unseen-keys (git checkout it; design §3.2): its
#      gpu_unseen.sh from ci there (planner and table-variant GPU tests, the cost); first the
#      sm100 decision on the CPU (14 repair kernels compile to a trap there)
#   1. bash ci/gpu_next.sh 1   # main: tests test_a* .. test_h*, golden verify        (~9 min)
#   2. bash ci/gpu_next.sh 2   # main: host time per eager call, decode tile variants (~3 min)
#   3. bash ci/gpu_next.sh 3   # main: docs/bench-h200.* re-recorded with the FA4 peers (issue
#                              # 36 item 1); run() with carry [".fa4"]                (~9 min)
#   4. python3 ci/tune_sm90.py --round d64-backward, then --round d64-forward (issue 36: d64;
#      all their variants compile for sm90 without spills: --compile)                 (~6 min)
# Logs go to $OUT (at most 8 files come back).
set -uo pipefail
PART=${1:?usage: bash ci/gpu_next.sh 1|2|3}
OUT=${OUT:-/tmp/portattn-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
if [ "$PART" = 1 ]; then
  # -v: a run cut by its limit still names its failures (session 23 lost one that way)
  # shellcheck disable=SC2046
  step pytest "${PYTEST_LIMIT:-480}" python3 -m pytest $(ls tests/test_[a-h]*.py) -v -n 15 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE
  grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest.log" | grep -v PASSED | tail -n 15
fi
if [ "$PART" = 1 ]; then
  step golden 90 python3 -m portattn golden verify --family sm90; tail -n 2 "$OUT/golden.log"
elif [ "$PART" = 3 ]; then
  # shellcheck disable=SC1091
  source .fa4/install.sh || echo "FA4 not installed: the bench runs without its peer"
  step bench 560 python3 benchmarks/bench.py --json "$OUT/bench-h200.json" \
    --markdown "$OUT/bench-h200.md" --png "$OUT/bench-h200.png"
  grep -E "^\| (workload|skewed|equal)" "$OUT/bench.log" | head -n 26
else
  step host 60 python3 benchmarks/host_overhead.py --gpu --n 1000
  grep -E "^\|" "$OUT/host.log"
  step decode_tiles 100 python3 ci/tune_decode_sm90.py --kernel varlen --head-dim 128
  grep -E "^\|" "$OUT/decode_tiles.log"
fi
printf '%s\n' "${summary[@]}"
