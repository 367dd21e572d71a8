#!/usr/bin/env bash
# The next session's GPU calls (30 device-minutes a session; a cold start costs 1.5-3 of them).
# Session 25 ran on the H200: branch wip/unseen-keys (merged: issue 35 item 4) with its GPU
# tests (63 + 257 + 550 passed), golden verify sm90 30/30, the repair passes' cost, the d64
# tune rounds (no variant beat the table), portattn vs FA4 on the 12 bench workloads, and
# host_overhead (varlen no-grad 339 µs per eager call on the H200 host, 70 µs with the
# launches stubbed on a CPU). Session 26 had no device time (a CI retry): it landed the
# kvcache checks per call signature and the append kernel (perf-notes row 74), CPU-tested
# only. What is left:
#   1. bash ci/gpu_next.sh 1   # kernels.launcher and the append kernel (landed without GPU
#                              # time): their GPU tests with kvcache, host caches, CUDA
#                              # graphs and rollout; launch_overhead.py (the public call
#                              # with and without the launcher, bits; JIT launch vs binder vs
#                              # compiled launcher); host_overhead --profile, with the append
#                              # kernel and with aten index_put_ (--aten-append), every case
#                              #                                                  (~8 min)
#   2. bash ci/gpu_next.sh 2   # tests test_a* .. test_h*, golden verify            (~9 min)
#   3. bash ci/gpu_next.sh 3   # docs/bench-h200.* re-recorded with the FA4 peers (issue
#                              # 36 item 1); run() with carry [".fa4"]                (~9 min)
#   4. bash ci/gpu_next.sh 4   # docs/bench-decode-h200.* re-recorded with the FA4 peers
#                              # (issue 37 item 4); run() with carry [".fa4"]       (~8 min)
#   5. bash ci/gpu_next.sh 5   # issue 37 item 2: the paged decode against the packed one,
#                              # pages 16/64/256, bits and graph TB/s, then Nsight Compute
#                              # of both at B64 (speed of light, warp stalls)       (~6 min)
#   6. bash ci/gpu_next.sh 6   # the repair passes: their cost on the skewed 16k pack, eager
#                              # and replayed (perf-notes row 72: the d64 causal row fell
#                              # from 292 to 175 TF/s fwd+bwd), and ncu of them beside their
#                              # passes (waves, occupancy: perf-notes row 75)     (~6 min)
# Logs go to $OUT (at most 8 files come back).
set -uo pipefail
PART=${1:?usage: bash ci/gpu_next.sh 1|2|3|4|5|6}
OUT=${OUT:-/tmp/portattn-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
if [ "$PART" = 1 ]; then
  step launcher 150 python3 -m pytest tests/test_launcher.py tests/test_cuda_graphs.py \
    tests/test_append.py tests/test_kvcache.py tests/test_kvcache_errors.py \
    tests/test_host_caches.py tests/test_rollout_gpu.py -n 8 -v \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE
  grep -E "FAILED|ERROR|passed|failed" "$OUT/launcher.log" | grep -v PASSED | tail -n 8
  step launch 120 python3 benchmarks/launch_overhead.py --n 2000
  grep -E "^\|" "$OUT/launch.log"
  step host 100 python3 benchmarks/host_overhead.py --gpu --n 1000 --profile --sort tottime \
    --cases varlen_nograd,paged_append_t,paged_append_i
  grep -E "^\|" "$OUT/host.log"
  step host_aten 60 python3 benchmarks/host_overhead.py --gpu --n 1000 --aten-append \
    --cases paged_append_t,paged_append_i,paged_append_step
  grep -E "^\|" "$OUT/host_aten.log"
  step host_all 90 python3 benchmarks/host_overhead.py --gpu --n 1000
  grep -E "^\|" "$OUT/host_all.log"
elif [ "$PART" = 2 ]; then
  # -v: a run cut by its limit still names its failures (session 23 lost one that way)
  # shellcheck disable=SC2046
  step pytest "${PYTEST_LIMIT:-480}" python3 -m pytest $(ls tests/test_[a-h]*.py) -v -n 15 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE
  grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest.log" | grep -v PASSED | tail -n 15
  step golden 90 python3 -m portattn golden verify --family sm90; tail -n 2 "$OUT/golden.log"
elif [ "$PART" = 3 ]; then
  # shellcheck disable=SC1091
  source .fa4/install.sh || echo "FA4 not installed: the bench runs without its peer"
  step bench 560 python3 benchmarks/bench.py --json "$OUT/bench-h200.json" \
    --markdown "$OUT/bench-h200.md" --png "$OUT/bench-h200.png"
  grep -E "^\| (workload|skewed|equal)" "$OUT/bench.log" | head -n 26
elif [ "$PART" = 4 ]; then
  # shellcheck disable=SC1091
  source .fa4/install.sh || echo "FA4 not installed: the bench runs without its peer"
  step decode 540 python3 benchmarks/bench.py --decode --json "$OUT/bench-decode-h200.json" \
    --markdown "$OUT/bench-decode-h200.md"
  grep -E "^\|" "$OUT/decode.log" | head -n 30
elif [ "$PART" = 5 ]; then
  step paged 150 python3 ci/decode_paged_ab.py
  grep -E "^\|" "$OUT/paged.log"
  step paged_ncu 240 ncu --clock-control none --kernel-name regex:attn_decode_kernel -c 12 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section MemoryWorkloadAnalysis python3 ci/decode_paged_ab.py --ncu --workloads "decode B64"
  grep -E "attn_decode_kernel|Duration|DRAM Throughput|Memory Throughput|Stall|Achieved Occ" \
    "$OUT/paged_ncu.log" | head -n 60
elif [ "$PART" = 6 ]; then
  step repair 150 python3 ci/bench_repair.py --tokens skewed16k --head-dims 64,128 --passes 2
  grep -E "^\|" "$OUT/repair.log"
  step repair_ncu 200 ncu --clock-control none -c 40 \
    --kernel-name regex:"attn_(fwd|bwd_dkdv|bwd_dq)(_ws)?_kernel" \
    --section LaunchStats --section Occupancy --section SpeedOfLight python3 ci/repair_probe.py
  grep -E "attn_|Duration|Waves Per SM|Dynamic Shared|Achieved Occ|Grid Size" \
    "$OUT/repair_ncu.log" | head -n 80
fi
printf '%s\n' "${summary[@]}"
