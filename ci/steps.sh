# Sourced by the GPU session scripts (ci/h200_suite.sh, ci/family_override.sh): `step NAME
# SECONDS CMD...` runs CMD with a time limit, its output into $OUT/NAME.log, and appends a
# "NAME rc=.. seconds" line to the `summary` array that the script prints last.
summary=()
# What every GPU call script sets up: $OUT (default /tmp/portattn-out), unbuffered Python with
# the checkout on its path, and with `fa4` FlashAttention-4 from the carried .fa4/ (its log in
# $OUT/fa4_install.log). Call it right after sourcing this file.
gpu_setup() {
  OUT=${OUT:-/tmp/portattn-out}
  mkdir -p "$OUT"
  export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
  if [ "${1:-}" = fa4 ]; then source .fa4/install.sh >"$OUT/fa4_install.log" 2>&1; fi
}
step() {
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-10s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
  return $rc
}
# `patched_copy DIR PATCH[+PATCH...]`: a copy of the checkout (without .fa4) in DIR with the
# patches applied in order (paths relative to the checkout); returns 2 if one does not apply.
patched_copy() {
  local dir=$1 root=$PWD p
  rm -rf "$dir" && mkdir -p "$dir"
  tar --exclude=./.fa4 -cf - . | tar -xf - -C "$dir"
  IFS=+ read -ra parts <<<"$2"
  for p in "${parts[@]}"; do
    (cd "$dir" && patch -s -p1 --forward --no-backup-if-mismatch -r - <"$root/$p") \
      || { echo "$p does not apply"; return 2; }
  done
}
# `step_tail NAME SECONDS LINES CMD...`: `step`, then the last LINES lines of its log.
step_tail() {
  local name=$1 limit=$2 lines=$3; shift 3
  step "$name" "$limit" "$@"
  local rc=$?
  tail -n "$lines" "$OUT/$name.log"
  return $rc
}
