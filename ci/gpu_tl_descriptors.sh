#!/usr/bin/env bash
# A/B of the checkout against the checkout with a patch applied, for the Triton kernels, both
# portattn kernels (perf-notes rows 106-107; issue 36): hashes of out (and of the gradients)
# and ms, forward (ab) or forward+backward (ab-bwd), in alternating processes with their own
# Triton caches, two rounds; then (tests) the GPU tests of the launch paths and golden verify
# on the patched checkout.
#   bash ci/gpu_tl_descriptors.sh ab PATCH        # forward, six workloads (~3 min warm)
#   bash ci/gpu_tl_descriptors.sh ab-bwd PATCH    # forward+backward, three d64 workloads
#                                                 # (D128=1: and two d128 ones)
#   bash ci/gpu_tl_descriptors.sh tests PATCH     # GPU tests and golden verify sm90 (~7 min)
# Session 38 ran it with the checkout at main before row 106 and its patch (the Triton
# forward and dQ through host descriptors): the forward was kept, dQ's not
# (ci/patches/tl_host_dq.diff, which applies to main after row 106).
set -uo pipefail
PART=${1:?usage: bash ci/gpu_tl_descriptors.sh ab|ab-bwd|tests PATCH}
PATCH=${2:?usage: bash ci/gpu_tl_descriptors.sh ab|ab-bwd|tests PATCH}
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup
nvidia-smi --query-gpu=name --format=csv,noheader
NEW=/tmp/patched
patched_copy "$NEW" "$PATCH" || exit 2
W=(--workloads "skewed 16k h16 d64 causal" --workloads "skewed 16k h16 d64 full"
   --workloads "rl 64x(32..2048) h16 d64 causal" --workloads "equal 2x8192 h16 d64 causal"
   --workloads "skewed 32k h16 d128 causal" --workloads "rl 64x(32..2048) gqa32/8 d128 causal")
MODE=(--fwd-only)
if [ "$PART" = ab-bwd ]; then
  MODE=()
  W=(--workloads "rl 64x(32..2048) h16 d64 causal" --workloads "skewed 16k h16 d64 causal"
     --workloads "skewed 16k h16 d64 full")
  [ "${D128:-0}" = 1 ] && W+=(--workloads "rl 64x(32..2048) gqa32/8 d128 causal"
                              --workloads "skewed 32k h16 d128 causal")
fi
if [ "$PART" = ab ] || [ "$PART" = ab-bwd ]; then
  for round in 1 2; do
    order=(main new); [ "$round" = 2 ] && order=(new main)
    for v in "${order[@]}"; do
      dir=$PWD; [ "$v" = new ] && dir=$NEW
      (cd "$dir" && PYTHONPATH=$dir TRITON_CACHE_DIR=/tmp/tc_$v timeout 200 python3 \
        ci/wait_barrier_probe.py "${MODE[@]}" --fixed-order "${W[@]}" >"$OUT/${v}_$round.log" 2>&1)
      echo "== $v round $round rc=$?"; grep -E "^\||Error" "$OUT/${v}_$round.log" | sort
    done
  done
elif [ "$PART" = tests ]; then
  cd "$NEW" || exit 2
  export PYTHONPATH=$NEW
  step tests 330 python3 -m pytest tests/test_table_variants.py tests/test_ws_variants.py tests/test_unseen_keys.py \
    tests/test_descriptors.py tests/test_launcher.py tests/test_forward_replay.py \
    tests/test_cuda_graphs.py tests/test_invariance_gpu.py tests/test_gpu.py \
    tests/test_key_chunk.py tests/test_direct_calls.py -n 8 -p no:cacheprovider \
    -W ignore::DeprecationWarning -rfE -q
  tail -n 8 "$OUT/tests.log"
  step golden 200 python3 -m portattn golden verify --family sm90
  tail -n 3 "$OUT/golden.log"
fi
printf '%s\n' "${summary[@]}"
