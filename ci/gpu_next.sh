#!/usr/bin/env bash
# The next session's GPU calls (30 device-minutes a session: two calls of under 10 minutes).
# What main has that the H200 has not run yet (session 22): the eager host-time work of issue
# 37 item 3 round 2 (tensor_memo, the lse scratch, no placeholder out32), the tools move of
# issue 38 (ci/golden_dev), ci/tune_decode_sm90.py. Logs go to $OUT (at most 8 files come back).
#   bash ci/gpu_next.sh 1   # tests test_a* .. test_h*, golden verify          (~8 min)
#   bash ci/gpu_next.sh 2   # tests test_i* .. test_z*, host time, decode tiles (~9 min)
set -uo pipefail
PART=${1:?usage: bash ci/gpu_next.sh 1|2}
OUT=${OUT:-/tmp/portattn-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
if [ "$PART" = 1 ]; then
  files=$(ls tests/test_[a-h]*.py)
else
  files=$(ls tests/test_[i-z]*.py)
fi
# shellcheck disable=SC2086
step pytest "${PYTEST_LIMIT:-420}" python3 -m pytest $files -q -n 15 -p no:cacheprovider \
  -W ignore::DeprecationWarning -rfE
tail -n 15 "$OUT/pytest.log"
if [ "$PART" = 1 ]; then
  step golden 90 python3 -m portattn golden verify --family sm90; tail -n 2 "$OUT/golden.log"
else
  step host 60 python3 benchmarks/host_overhead.py --gpu --n 1000
  grep -E "^\|" "$OUT/host.log"
  step decode_tiles 100 python3 ci/tune_decode_sm90.py --kernel varlen --head-dim 128
  grep -E "^\|" "$OUT/decode_tiles.log"
fi
printf '%s\n' "${summary[@]}"
