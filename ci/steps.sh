# Sourced by the GPU session scripts (ci/h200_suite.sh, ci/family_override.sh): `step NAME
# SECONDS CMD...` runs CMD with a time limit, its output into $OUT/NAME.log, and appends a
# "NAME rc=.. seconds" line to the `summary` array that the script prints last.
summary=()
step() {
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-10s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
  return $rc
}
