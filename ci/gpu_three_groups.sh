#!/usr/bin/env bash
# The Gluon forward in three consumer groups (ci/patches/gluon_three_groups.diff, session 37;
# made against b3a1d76, before the host descriptors landed: perf-notes rows 104-105):
# on a patched copy of the tree in /tmp/three_groups, `python ci/tune_sm90.py --round
# d64-three-groups` (d64 forward TF/s, skewed 32k h16, the table's Triton 64 x 64 against the
# Gluon forward at 192 x 64 / 192 x 128 and at 128 x 128; each variant checked against
# float64 first), then its GPU test: the three-group forward gives the Triton forward's bits
# at the same key tile (varlen and fixed_order, causal and not, bf16 and fp16). Limits:
# ROUND_LIMIT (default 240 s), TESTS_LIMIT (120 s).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
gpu_setup
patched_copy /tmp/three_groups ci/patches/gluon_three_groups.diff || exit 2
cd /tmp/three_groups || exit 2
export PYTHONPATH=/tmp/three_groups
step round "${ROUND_LIMIT:-240}" python3 ci/tune_sm90.py --round d64-three-groups
grep -E "^\||^\{|rror" "$OUT/round.log" | cut -c1-400
step tests3 "${TESTS_LIMIT:-120}" python3 -m pytest tests/test_table_variants.py \
  -k "three_groups or fwd_ws_same_bits" -n 8 -p no:cacheprovider -W ignore::DeprecationWarning \
  -rfE -q
tail -n 4 "$OUT/tests3.log"
printf '%s\n' "${summary[@]}"
