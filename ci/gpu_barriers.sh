#!/usr/bin/env bash
# Session 34's second GPU call (issue 36, perf-notes row 97; carry .fa4): the warp-specialised
# kernels with and without the warp-group barriers before their mbarrier waits and arrives
# (ci/wait_barriers.py), in alternating processes (keep, drop, keep, drop), each with its own
# Triton cache; bits must match between keep and drop. Then Nsight Compute of the dropped
# forward (stalls). Logs go to $OUT.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup fa4
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do
  for mode in keep drop; do
    extra=(); [ "$round" = 1 ] && [ "$mode" = keep ] && extra=(--fa4)
    TRITON_CACHE_DIR=/tmp/tc_$mode WAIT_BARRIERS=$mode step "${mode}_$round" 240 \
      python3 ci/wait_barriers.py ci/wait_barrier_probe.py "${extra[@]}"
    echo "== $mode round $round"; grep -E "^\||dropped|Error|error" "$OUT/${mode}_$round.log" | sort | uniq
  done
done
METRICS=gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
METRICS+=,smsp__issue_active.avg.pct_of_peak_sustained_active
METRICS+=',regex:smsp__average_warps_issue_stalled_(barrier|wait|long_scoreboard|gmma|dispatch_stall)_per_issue_active\.ratio'
TRITON_CACHE_DIR=/tmp/tc_drop step ncu 120 ncu --clock-control none --nvtx \
  --nvtx-include portattn.fwd/ --metrics "$METRICS" \
  python3 ci/wait_barriers.py ci/ncu_peers.py --modes fwd --workloads "equal 2x8192 h16 d128 causal"
grep -E "^  [a-zA-Z_].*\(|gpu__time|tensor_cycles|issue_active|stalled" "$OUT/ncu.log" | head -n 40
printf '%s\n' "${summary[@]}"
