#!/usr/bin/env bash
# One GPU session on a lent machine, in steps that each have a time limit:
#   1. the GPU test suite (pytest, all tests on the GPU), 2. golden refresh for the family
#   (only if the tests passed), 3. `python -m portattn check`, 4. the accuracy table,
#   5. the benchmark. Logs go under ${OUT:-/tmp/portattn-out}; a short summary prints last.
# Usage: bash ci/h200_suite.sh [family]   (nox wheels in .whl/ when nox is not installed)
set -uo pipefail
FAMILY=${1:-sm90}
OUT=${OUT:-/tmp/portattn-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ! python3 -c "import nox" 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >>"$OUT/device.txt"
step pytest "${PYTEST_LIMIT:-330}" python3 -m pytest tests -q -n 8 -p no:cacheprovider \
  -W ignore::DeprecationWarning --junitxml="$OUT/junit.xml"
rc_tests=$?
tail -n 25 "$OUT/pytest.log"
if [ "$rc_tests" = 0 ] && [ "${REFRESH:-1}" = 1 ]; then
  step golden 120 python3 -m nox -s "golden_refresh(family='$FAMILY')" \
    && cp "golden/$FAMILY.json" "$OUT/"
  tail -n 5 "$OUT/golden.log"
fi
step check 60 python3 -m portattn check; tail -n 12 "$OUT/check.log"
step accuracy 90 python3 ci/accuracy_table.py; cp "$OUT/accuracy.log" "$OUT/accuracy.md"
step bench "${BENCH_LIMIT:-420}" python3 benchmarks/bench.py --json "$OUT/bench.json" \
  --markdown "$OUT/bench.md"
cat "$OUT/accuracy.md"
grep -E "^\|" "$OUT/bench.log"
cat "$OUT/device.txt"
printf '%s\n' "${summary[@]}"
