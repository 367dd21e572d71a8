#!/usr/bin/env bash
# The GPU call for branch wip/unseen-keys (issue 35 item 4, design §3.2), from a checkout of it:
# the bitwise tests of the repair passes on the H200, the GPU tests of the planners and of the
# table variants (the first passes), then their cost. Logs go to $OUT.
#   bash ci/gpu_unseen.sh        # ~9 min (session 24: the variants step needs more than 120 s)
set -uo pipefail
OUT=${OUT:-/tmp/portattn-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
# -v: a run cut by its limit still names its failures
step unseen 150 python3 -m pytest tests/test_unseen_keys.py tests/test_plan.py -v -n 8 \
  -p no:cacheprovider -W ignore::DeprecationWarning -rfE
grep -E "FAILED|ERROR|passed|failed" "$OUT/unseen.log" | grep -v PASSED | tail -n 12
step variants 240 python3 -m pytest tests/test_table_variants.py tests/test_ws_variants.py tests/test_invariance_gpu.py -v \
  -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE
grep -E "FAILED|ERROR|passed|failed" "$OUT/variants.log" | grep -v PASSED | tail -n 8
step bench 150 python3 ci/bench_repair.py --tokens 8x2048,1x32768 --head-dims 128 --passes 2
grep -E "^\|" "$OUT/bench.log"
printf '%s\n' "${summary[@]}"
