#!/usr/bin/env bash
# Session 35 (issue 36, perf-notes row 101): where a program's fixed costs go on packs of
# short sequences (bench.overhead_workloads: RL-like 64 x 32..2048, 1024 one-tile sequences),
# where portattn's forward is 0.72-0.77x FA4 deterministic's (row 100): CUDA µs per kernel
# (torch.profiler) of both, then Nsight Compute's warp-state sampling per SASS instruction of
# portattn's Gluon forward and FA4's on the RL causal pack (CSV source pages). Carry .fa4.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup fa4
nvidia-smi --query-gpu=name --format=csv,noheader
RL="rl 64x(32..2048) gqa32/8 d128 causal"
step profile 120 python3 ci/ncu_peers.py --profile --modes fwd --workloads "$RL" \
  --workloads "rl 64x(32..2048) h16 d128 full" --workloads "tiles 1024x128 h16 d128 full"
grep -E "^###|^- " "$OUT/profile.log"
for tag in portattn fa4; do
  step "ncu_$tag" 120 ncu --clock-control none --nvtx --nvtx-include "$tag.fwd/" \
    --section SourceCounters --section WarpStateStats --section LaunchStats -f -o "/tmp/$tag" \
    python3 ci/ncu_peers.py --only "$tag" --modes fwd --workloads "$RL"
  tail -n 2 "$OUT/ncu_$tag.log"
  # at most 8 files come back: the CSV, the details only as printed here
  ncu --import "/tmp/$tag.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/sass_$tag.csv" 2>/dev/null
  ncu --import "/tmp/$tag.ncu-rep" --page details 2>&1 \
    | grep -E "^  [a-z]|Grid Size|Block Size|Registers Per|Waves|Warp Cycles|excessive" | head -n 24
done
printf '%s\n' "${summary[@]}"
