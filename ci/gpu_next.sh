#!/usr/bin/env bash
# The next session's GPU calls (30 device-minutes a session; a cold start costs 1.5-3 of them).
# Session 27 ran parts 1-6 of the list before this one on the H200 (main 30c2186): the launcher's
# and the append kernel's GPU tests (189 passed), tests a-h (571 passed, 97% within the limit,
# none failed), golden verify sm90 30/30, docs/bench-h200.* and docs/bench-decode-h200.*
# re-recorded with FA4, the paged-vs-packed decode with ncu (perf-notes row 78) and the repair
# passes' cost (row 79). What is left:
#   1. bash ci/gpu_next.sh 1   # the forward's and dQ's repair passes, one program per query
#                              # tile over all heads (design 3.2, perf-notes rows 82-83; landed
#                              # without GPU
#                              # time: the first pass's machine code is unchanged on every
#                              # family, the repair's is new): the unseen-key and plan GPU
#                              # tests (repaired rows = a clean run's, bitwise), golden verify
#                              # sm90, bench_repair against row 79's +4-7%, ncu launch stats.
#                              # The same for dQ's repair (backward_dq.py, row 83). Run first;
#                              # if it fails, revert the commits that landed them (873be8b, and
#                              # the dQ one) and re-record the fingerprints        (~7 min)
#   2. bash ci/gpu_next.sh 2   # issue 37 item 2 (perf-notes row 80): the paged decode with one
#                              # block-table read per key tile (ci/patches/paged_tile_page.diff;
#                              # measured in session 27: +2-12% where a page holds whole key
#                              # tiles, bits equal, varlen at pages 16/64 unchanged, paged still
#                              # 0.69x packed): the paged GPU tests on the patched tree, then
#                              # Nsight Compute of packed vs paged at B64 with the warp-stall
#                              # and source counters, to find what the paged loop waits on
#                              # (~6 min). Before landing it: it spills on sm80 varlen d32
#                              # decode (perf-notes row 80); then python -m ci.golden_dev
#                              # fingerprints --update under Triton 3.6 and 3.9 (13 + 20 min
#                              # CPU: every compile key changes)
#   3. bash ci/gpu_next.sh 3   # tests test_[i-z]* (not run on the GPU since session 25) (~9 min)
#   4. bash ci/gpu_next.sh 4   # transformers: benchmarks/transformers_llama.py (training step
#                              # and a decode step against SDPA; never run on a GPU)   (~5 min)
#   5. bash ci/gpu_next.sh 5   # the repair passes at 4 warps (ci/patches/repair_four_warps.diff;
#                              # perf-notes row 81: two programs per SM where one fit, so half
#                              # the waves; now mostly for the dQ and dK/dV repairs):
#                              # bench_repair on main, then patched, and the GPU unseen-key
#                              # tests on the patched tree; reverted after          (~6 min)
# Logs go to $OUT (at most 8 files come back).
set -uo pipefail
PART=${1:?usage: bash ci/gpu_next.sh 1|2|3|4|5}
OUT=${OUT:-/tmp/portattn-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
if [ "$PART" = 1 ]; then
  step repair_tests 200 python3 -m pytest tests/test_unseen_keys.py tests/test_plan.py \
    tests/test_correctness.py -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/repair_tests.log"
  step golden 90 python3 -m portattn golden verify --family sm90; tail -n 2 "$OUT/golden.log"
  step repair 120 python3 ci/bench_repair.py --tokens skewed16k,8x2048 --head-dims 64,128 \
    --passes 2
  grep -E "^\|" "$OUT/repair.log"
  step repair_ncu 120 ncu --clock-control none -c 12 \
    --kernel-name regex:"attn_(fwd|bwd_dkdv|bwd_dq)(_ws)?_kernel" \
    --section LaunchStats --section Occupancy --section SpeedOfLight python3 ci/repair_probe.py
  grep -E "attn_|Duration|Waves Per SM|Grid Size" "$OUT/repair_ncu.log" | head -n 50
elif [ "$PART" = 2 ]; then
  patch -p1 <ci/patches/paged_tile_page.diff >/dev/null && echo "patch applied"
  step paged_tests 200 python3 -m pytest tests/test_kvcache.py tests/test_rollout_gpu.py \
    tests/test_cuda_graphs.py tests/test_append.py tests/test_model_features.py -n 8 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/paged_tests.log"
  step paged_tile 90 python3 ci/decode_paged_ab.py --kernel varlen --kernel fixed_order
  grep -E "^\|" "$OUT/paged_tile.log"
  step paged_ncu 240 ncu --clock-control none --kernel-name regex:attn_decode_kernel -c 4 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --section InstructionStats --section SchedulerStats python3 ci/decode_paged_ab.py --ncu \
    --workloads "decode B64"
  grep -E "attn_decode_kernel|Duration|DRAM Throughput|Stall|Warp Cycles|Eligible|Issued Warp" \
    "$OUT/paged_ncu.log" | head -n 80
  patch -R -p1 <ci/patches/paged_tile_page.diff >/dev/null && echo "patch reverted"
elif [ "$PART" = 3 ]; then
  # -v: a run cut by its limit still names its failures (session 23 lost one that way)
  # shellcheck disable=SC2046
  step pytest "${PYTEST_LIMIT:-520}" python3 -m pytest $(ls tests/test_[i-z]*.py) -v -n 15 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE
  grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest.log" | grep -v PASSED | tail -n 15
elif [ "$PART" = 4 ]; then
  step llama 280 python3 benchmarks/transformers_llama.py --json "$OUT/transformers.json"
  grep -E "^\|" "$OUT/llama.log" | head -n 30
elif [ "$PART" = 5 ]; then
  step repair_main 120 python3 ci/bench_repair.py --tokens skewed16k,8x2048 --head-dims 64,128 \
    --passes 2
  grep -E "^\|" "$OUT/repair_main.log"
  patch -p1 <ci/patches/repair_four_warps.diff >/dev/null && echo "patch applied"
  step repair_tests 150 python3 -m pytest tests/test_unseen_keys.py tests/test_plan.py -n 8 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/repair_tests.log"
  step repair_4w 120 python3 ci/bench_repair.py --tokens skewed16k,8x2048 --head-dims 64,128 \
    --passes 2
  grep -E "^\|" "$OUT/repair_4w.log"
  patch -R -p1 <ci/patches/repair_four_warps.diff >/dev/null && echo "patch reverted"
fi
printf '%s\n' "${summary[@]}"
