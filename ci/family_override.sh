#!/usr/bin/env bash
# One GPU session that runs an older NVIDIA family's configuration on a newer GPU through the
# family override (docs/families.md): e.g. sm80's entries as compute_80 PTX on an H200.
#   1. ci/family_override_probe.py: what was loaded (PTX target, matrix instruction, spills),
#   2. ci.golden_dev refresh --family <family>: provisional hashes into golden/<family>.json,
#   3. golden verify --family <family> in a second process,
#   4. the accuracy table; beside 2-4, 5. the whole GPU test suite under the override.
# Logs go under ${OUT:-/tmp/portattn-out}; a short summary prints last.
# Usage: bash ci/family_override.sh [family]    (default sm80)
set -uo pipefail
FAMILY=${1:-sm80}
OUT=${OUT:-/tmp/portattn-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PORTATTN_FAMILY_OVERRIDE=$FAMILY
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
step probe 120 python3 ci/family_override_probe.py; rc_probe=$?
tail -n 30 "$OUT/probe.log"
if [ "$rc_probe" = 0 ]; then
  # The golden chain and the suite run side by side (the bits do not depend on timing), so the
  # whole session fits one 10-minute device call.
  (
    step refresh "${REFRESH_LIMIT:-300}" python3 -m ci.golden_dev refresh --family "$FAMILY" \
      && cp "golden/$FAMILY.json" "$OUT/"
    step verify 120 python3 -m portattn golden verify --family "$FAMILY"
    step accuracy 120 python3 ci/accuracy_table.py && cp "$OUT/accuracy.log" "$OUT/accuracy.md"
    printf '%s\n' "${summary[@]}" >"$OUT/golden-summary.txt"
  ) &
  golden=$!
  step pytest "${PYTEST_LIMIT:-360}" python3 -m pytest tests -q -n 8 -p no:cacheprovider \
    -W ignore::DeprecationWarning --junitxml="$OUT/junit.xml"
  wait "$golden"
  grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest.log" | tail -n 40
  tail -n 6 "$OUT/refresh.log"; tail -n 3 "$OUT/verify.log"
  cat "$OUT/accuracy.md" 2>/dev/null
  cat "$OUT/golden-summary.txt" 2>/dev/null
fi
printf '%s\n' "${summary[@]}"
