#!/usr/bin/env bash
# Session 34's last GPU call (issue 36, perf-notes row 97): the Gluon forward with FA4's order
# in a step (rescale of acc after the wait for P V, so P V is issued right after Q K^T: version
# I) and also P packed to bf16 under the exponentials (version J, the working tree) against main,
# in alternating processes with their own Triton caches (ab_fwd/forward_ws_{main,I,J}.py,
# untracked copies made before the call, e.g. `git show 0e59409:portattn/kernels/forward_ws.py
# > ab_fwd/forward_ws_main.py`); bits of out must be equal; then the Gluon forward's GPU tests
# on J. Perf-notes row 98; a template for the next A/B of a kernel file.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup
nvidia-smi --query-gpu=name --format=csv,noheader
W=(--workloads "equal 2x8192 h16 d128 causal" --workloads "equal 2x8192 h16 d128 full"
   --workloads "skewed 32k h16 d128 causal" --workloads "equal 2x8192 gqa32/8 d128 causal")
for round in 1 2; do
  for v in main I J; do
    cp "ab_fwd/forward_ws_$v.py" portattn/kernels/forward_ws.py
    TRITON_CACHE_DIR=/tmp/tc_$v step "${v}_$round" 100 python3 ci/wait_barrier_probe.py \
      --fwd-only "${W[@]}"
    echo "== $v round $round"; grep -E "^\||Error" "$OUT/${v}_$round.log" | sort
  done
done
cp ab_fwd/forward_ws_J.py portattn/kernels/forward_ws.py
step tests 150 python3 -m pytest tests/test_table_variants.py tests/test_key_chunk.py \
  -k "fwd_ws or gluon" -n 8 -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
tail -n 4 "$OUT/tests.log"
printf '%s\n' "${summary[@]}"
