#!/usr/bin/env bash
# Session 34's first GPU call (issue 36 / 37; carry .fa4): where a small varlen forward's GPU
# time goes beside FA4's (ci/host_peers.py --kernels), the training calls' kernels per call
# (ci/ncu_peers.py --profile), and Nsight Compute of portattn varlen and FA4 deterministic on the
# same calls: time, tensor-pipe and XU use, SM activity over the kernel (tail), issue stalls.
# Logs go to $OUT.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup fa4
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
W=(--workloads "equal 2x8192 h16 d128 causal" --workloads "equal 2x8192 h16 d64 causal"
   --workloads "skewed 16k h16 d64 causal")
[ "${NCU_ONLY:-0}" = 1 ] || step host_peers 150 python3 ci/host_peers.py --kernels --n 200
grep -E "^\||^###|^- " "$OUT/host_peers.log" | head -n 40
[ "${NCU_ONLY:-0}" = 1 ] || step kernels 150 python3 ci/ncu_peers.py --profile "${W[@]}"
grep -E "^###|^- " "$OUT/kernels.log" | head -n 80
METRICS=gpu__time_duration.sum,sm__cycles_active.avg.pct_of_peak_sustained_elapsed
METRICS+=,regex:sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active
METRICS+=,regex:sm__inst_executed_pipe_xu\.avg\.pct_of_peak_sustained_active
METRICS+=,launch__registers_per_thread,launch__grid_size,launch__block_size
METRICS+=,launch__shared_mem_per_block_dynamic,dram__throughput.avg.pct_of_peak_sustained_elapsed
METRICS+=,smsp__issue_active.avg.pct_of_peak_sustained_active
METRICS+=,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio
NV=(--nvtx --nvtx-include portattn.fwd/ --nvtx-include fa4.fwd/ --nvtx-include portattn.train/
    --nvtx-include fa4.train/)
step ncu ${NCU_LIMIT:-300} ncu --clock-control none "${NV[@]}" --metrics "$METRICS" \
  python3 ci/ncu_peers.py "${W[@]}"
grep -E "^  [a-zA-Z_].*\(|gpu__time|gmma|xu.avg|cycles_active.avg|issue_active" "$OUT/ncu.log" \
  | head -n 150
printf '%s\n' "${summary[@]}"
