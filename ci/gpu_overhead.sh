#!/usr/bin/env bash
# Session 35 (issue 36, perf-notes row 102): where the forward loses on packs of short
# sequences (benchmarks/workloads.py overhead_workloads: RL-like 64 x 32..2048, 1024 one-tile sequences), where
# portattn's forward is 0.67-0.76x FA4 deterministic's: CUDA µs per kernel (torch.profiler) of
# both, then ci/gpu_stalls.sh (per-SASS stall sampling) on the RL causal pack. Carry .fa4.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup fa4
nvidia-smi --query-gpu=name --format=csv,noheader
RL="rl 64x(32..2048) gqa32/8 d128 causal"
step profile 120 python3 ci/ncu_peers.py --profile --modes fwd --workloads "$RL" \
  --workloads "rl 64x(32..2048) h16 d128 full" --workloads "tiles 1024x128 h16 d128 full"
grep -E "^###|^- " "$OUT/profile.log"
printf '%s\n' "${summary[@]}"
WORKLOAD=$RL bash "$(dirname "${BASH_SOURCE[0]}")/gpu_stalls.sh"
