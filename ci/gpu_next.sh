#!/usr/bin/env bash
# The next session's GPU calls (30 device-minutes a session; a cold start costs 1.5-3 of them).
# Session 28 ran the previous list on the H200 (main 89a9502..cf9527b): the one-wave forward and
# dQ repairs (113 GPU tests, golden sm90 30/30; perf-notes row 84), tests i-z (782 passed, the 2
# failures of tests/test_options.py fixed in cf9527b and passed on the GPU), transformers_llama
# (docs/performance.md), the paged patch with ncu (row 86) and the decode tile sweep (row 85).
# The machine stopped answering during the repair-at-4-warps call. Session 29 had no device
# (none was lent); its CPU work adds to part 1 and adds part 5. What is left:
#   1. bash ci/gpu_next.sh 1   # run first. (a) The replayed forward launches and the kept
#                              # launches of kvcache / varlen / dense calls (landed CPU-
#                              # verified, perf-notes rows 87, 89; the append kernel's strided
#                              # index fix): their GPU tests with the kvcache, append,
#                              # CUDA-graph, rollout, launcher and direct-call tests, host time
#                              # per eager call (row 76: varlen no-grad 179 us, paged decode
#                              # 220), the transformers decode step. (b) The paged key loop
#                              # with the block table read 16 tiles at a time into registers
#                              # (ci/patches/paged_page_block.diff, row 88; SASS: its K/V copies
#                              # pipeline as the packed loop's, DEPBAR.LE 2 instead of 0):
#                              # decode_paged_ab on main, then on the patched tree the paged GPU
#                              # tests and decode_paged_ab again (row 86: paged 0.68x packed);
#                              # reverted after                                     (~8 min)
#   2. bash ci/gpu_next.sh 2   # the repair passes at 4 warps (ci/patches/repair_four_warps.diff;
#                              # rows 81, 84: now mostly the dK/dV repairs, 2 x 18 us at 8x2048):
#                              # bench_repair on main, then patched, and the GPU unseen-key
#                              # tests on the patched tree; reverted after          (~6 min)
#   3. bash ci/gpu_next.sh 3   # tests test_[a-h]* (session 27: 571 passed, 97% within the limit)
#                              # (~9 min)
#   5. bash ci/gpu_next.sh 5   # right after 1: the paged patch's golden verify on sm90 (its
#                              # decode machine code against the recorded outputs) (~3 min)
#   4. bash ci/gpu_next.sh 4   # the paged decode's stall reasons (row 86 had none): ncu with
#                              # --print-details all on packed and paged B64        (~3 min)
#   If part 1's patched paged rows reach the packed ones and part 5 verifies 30/30: land the
#   patch (session 29 made it fit: the page block on sm90 only, rows.PAGE_BLOCK; its golden/
#   holds both Tritons' re-recorded keys and fingerprints, only sm90's decode fingerprints
#   changed; branch wip/paged-fit), then, with .fa4 carried, python benchmarks/bench.py
#   --decode (docs/bench-decode-h200.*).
# Logs go to $OUT (at most 8 files come back).
set -uo pipefail
PART=${1:?usage: bash ci/gpu_next.sh 1|2|3|4|5}
OUT=${OUT:-/tmp/portattn-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
if [ "$PART" = 1 ]; then
  step gpu_tests 200 python3 -m pytest tests/test_forward_replay.py tests/test_direct_calls.py \
    tests/test_kvcache.py tests/test_kvcache_replay.py tests/test_append.py \
    tests/test_cuda_graphs.py tests/test_rollout_gpu.py \
    tests/test_host_caches.py tests/test_launcher.py -n 8 -p no:cacheprovider \
    -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/gpu_tests.log"
  step host 100 python3 benchmarks/host_overhead.py --gpu --n 1000
  grep -E "^\|" "$OUT/host.log"
  step llama 120 python3 benchmarks/transformers_llama.py --json "$OUT/transformers.json"
  grep -E "decode" "$OUT/llama.log"
  step paged_main 60 python3 ci/decode_paged_ab.py --kernel varlen --kernel fixed_order
  grep -E "^\|" "$OUT/paged_main.log"
  patch -p1 <ci/patches/paged_page_block.diff >/dev/null && echo "patch applied"
  step paged_tests 150 python3 -m pytest tests/test_kvcache.py tests/test_page_block.py \
    tests/test_rollout_gpu.py tests/test_append.py tests/test_model_features.py -n 8 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/paged_tests.log"
  step paged_block 60 python3 ci/decode_paged_ab.py --kernel varlen --kernel fixed_order
  grep -E "^\|" "$OUT/paged_block.log"
  patch -R -p1 <ci/patches/paged_page_block.diff >/dev/null && echo "patch reverted"
elif [ "$PART" = 2 ]; then
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
elif [ "$PART" = 3 ]; then
  # -v: a run cut by its limit still names its failures (session 23 lost one that way)
  # shellcheck disable=SC2046
  step pytest "${PYTEST_LIMIT:-520}" python3 -m pytest $(ls tests/test_[a-h]*.py) -v -n 15 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE
  grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest.log" | grep -v PASSED | tail -n 15
elif [ "$PART" = 4 ]; then
  step paged_ncu 240 ncu --clock-control none --kernel-name regex:attn_decode_kernel -c 2 \
    --section WarpStateStats --section SourceCounters --print-details all \
    python3 ci/decode_paged_ab.py --ncu --workloads "decode B64"
  grep -iE "attn_decode_kernel|stall|Warp Cycles" "$OUT/paged_ncu.log" | head -n 80
elif [ "$PART" = 5 ]; then
  # The paged patch's sm90 decode machine code against the recorded golden outputs (its
  # golden/ carries the new fingerprints and keys; the output hashes are main's): 30/30 equal
  # means the patch keeps every recorded bit and can land.
  patch -p1 <ci/patches/paged_page_block.diff >/dev/null && echo "patch applied"
  step golden_paged 300 python3 -m portattn golden verify --family sm90
  tail -n 4 "$OUT/golden_paged.log"
  patch -R -p1 <ci/patches/paged_page_block.diff >/dev/null && echo "patch reverted"
fi
printf '%s\n' "${summary[@]}"
