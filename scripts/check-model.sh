#!/usr/bin/env bash
# Exhaustive check of the grant protocol model (model/grant.pml) with SPIN.
# See docs/protocol-model.md.
#
#   scripts/check-model.sh             full model, every bound configuration: must report 0 errors
#   scripts/check-model.sh --mutants   every deliberate bug must be caught by its invariant, and
#                                      every witness scenario must be reachable (non-vacuity)
#   scripts/check-model.sh --deep      the full model at larger bounds (3 borrows; minutes, ~7 GB)
#   scripts/check-model.sh --all       full + mutants
#
# Everything is built in a temporary directory; nothing is written to the repository.
# Exit status: 0 all good, 1 a check failed, 2 usage, 127 spin or gcc missing.
# Environment: CHECK_MODEL_JOBS (parallel runs, default: number of CPUs),
#              CHECK_MODEL_TRAIL=1 (print the counterexample of every mutant too).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model="$root/model/grant.pml"

usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

do_full=0 do_mutants=0 do_deep=0
case "${1:-}" in
  "") do_full=1 ;;
  --mutants) do_mutants=1 ;;
  --deep) do_deep=1 ;;
  --all) do_full=1; do_mutants=1 ;;
  -h|--help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac
[ $# -le 1 ] || { usage >&2; exit 2; }

for tool in spin gcc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "check-model: $tool not found (Debian: apt-get install spin gcc)" >&2
    exit 127
  fi
done
[ -f "$model" ] || { echo "check-model: $model not found" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/berth-model.XXXXXX")
trap 'rm -rf "$work"' EXIT
jobs_max=${CHECK_MODEL_JOBS:-$(nproc 2>/dev/null || echo 2)}

# Bound configurations of the full check: -D flags for the preprocessor.
FULL_CONFIGS=(
  "-DNB=2 -DTMAX=3 -DFAULTS=2"   # 2 borrows, clock 0..3, any 2 faults (loss, duplicate, failure, crash)
  "-DNB=2 -DTMAX=4 -DFAULTS=1"   # longer clock: grants of both durations, heartbeats, late expiry
)
DEEP_CONFIGS=(
  "-DNB=3 -DTMAX=3 -DFAULTS=1"   # 3 borrows: completions two generations late
)

# Mutant -> the assertion (invariant) that must catch it ("a|b": either; SPIN stops at the first
# violation its depth-first search meets).
MUTANTS=(
  "MUTANT_SPLIT_RETURN_TX          inv1_one_grant"
  "MUTANT_PARALLEL_REMOVE_FENCE    inv1_ready_clean"
  "MUTANT_ACTIVATE_BEFORE_CONFIRM  inv2_confirmed_by_provider"
  "MUTANT_NO_REVALIDATION          inv2_revalidated_unexpired"
  "MUTANT_EXPIRY_INCLUSIVE         inv3_expired_at_equality|inv2_revalidated_unexpired"
  "MUTANT_AGENT_EXPIRY_INCLUSIVE   inv3_expired_at_equality"
  "MUTANT_NO_AGENT_EXPIRY          inv3_expired_at_equality"
  "MUTANT_HEARTBEAT_EXTENDS        inv3_expires_at_immutable"
  "MUTANT_SKIP_GENERATION_CHECK    inv4_exact_generation"
  "MUTANT_AGENT_NO_TOMBSTONE       inv4_no_old_key"
  "MUTANT_AGENT_VOLATILE_TOMBSTONE inv4_no_old_key"
  "MUTANT_BLIND_REINSTALL          inv4_no_blind_reinstall"
  "MUTANT_READY_WITHOUT_FENCE      inv5_removed_fenced_scrubbed"
  "MUTANT_VOLATILE_CLEANUP_INTENT  inv6_ready_only_via_cleanup"
  "MUTANT_ACK_TIMEOUT_READY        inv6_ready_only_via_cleanup"
  "MUTANT_LATE_HEARTBEAT_REVIVES   inv6_no_revival"
)
# Witness -> the assertion that must fail, proving the scenario is reachable.
WITNESSES=(
  "WITNESS_REUSE                   witness_reuse"
  "WITNESS_SESSION                 witness_session"
  "WITNESS_STALE_COMPLETION        witness_stale_completion"
  "WITNESS_DUPLICATE_COMPLETION    witness_duplicate_completion"
  "WITNESS_INSTALL_REFUSED         witness_install_refused"
  "WITNESS_EXPIRY_CUT_WHILE_DOWN   witness_expiry_cut_while_down"
  "WITNESS_RESTART_RESUMES_CLEANUP witness_restart_resumes_cleanup"
  "WITNESS_QUARANTINE_DESTROYED    witness_quarantine_destroyed"
)

# run_pan <dir> <cflags> <pan flags> <spin -D flags...>: generate, compile and run one verifier.
run_pan() {
  local dir=$1 cflags=$2 panflags=$3; shift 3
  mkdir -p "$dir"
  (
    cd "$dir"
    cp "$model" grant.pml
    printf '%s\n' "$*" > dflags
    if ! spin "$@" -a grant.pml > spin.out 2>&1; then echo "spin -a failed" >> spin.out; exit 1; fi
    # shellcheck disable=SC2086
    if ! gcc -w $cflags -DSAFETY -o pan pan.c > gcc.out 2>&1; then exit 1; fi
    # shellcheck disable=SC2086
    ./pan $panflags > pan.out 2>&1 || true
  ) || echo "build failed" > "$dir/failed"
}

# Bounded parallelism.
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done; }

field() { # field <regex with one group> <file>
  sed -n -E "s/$1/\1/p" "$2" | head -n 1
}

# counterexample <dir>: replay the trail (same -D flags) and print its tail.
counterexample() {
  local dir=$1
  ( cd "$dir" && [ -f grant.pml.trail ] && \
    # shellcheck disable=SC2046
    spin $(cat dflags) -t -k grant.pml.trail grant.pml 2>&1 | grep -E '^ *t=|^ *\(fault|assertion violated' | sed 's/^ */    /' | tail -n 60 ) || true
}

status=0
fail() { echo "FAIL: $*"; status=1; }

report_full() { # report_full <dir> <label>
  local dir=$1 label=$2 out=$1/pan.out
  if [ -f "$dir/failed" ] || [ ! -s "$out" ]; then
    fail "model [$label]: could not build or run the verifier"; cat "$dir"/*.out 2>/dev/null | tail -n 20; return
  fi
  local errors states trans depth secs mem
  errors=$(field '.*errors: ([0-9]+).*' "$out")
  states=$(field '^ *([0-9.e+]+) states, stored.*' "$out")
  trans=$(field '^ *([0-9.e+]+) transitions .*' "$out")
  depth=$(field '.*depth reached ([0-9]+),.*' "$out")
  secs=$(field '^pan: elapsed time ([0-9.e+]+) seconds.*' "$out")
  mem=$(field '^ *([0-9.]+)[[:space:]]+total actual memory usage.*' "$out")
  echo "model [$label]: errors ${errors:-?}, ${states:-?} states stored, ${trans:-?} transitions, depth ${depth:-?}, ${secs:-?} s, ${mem:-?} MB"
  if grep -q "max search depth too small" "$out"; then fail "model [$label]: search depth bound hit (raise -m)"; fi
  if grep -q "out of memory\|aborted" "$out"; then fail "model [$label]: verifier ran out of memory or aborted"; fi
  if [ "${errors:-x}" != "0" ]; then
    fail "model [$label]: SPIN reports errors"
    grep -E "assertion violated|invalid end state|pan:" "$out" | head -n 5
    echo "--- counterexample (tail) ---"; counterexample "$dir"
  fi
}

report_expected() { # report_expected <dir> <kind> <name> <assertion>
  local dir=$1 kind=$2 name=$3 want=$4 out=$1/pan.out
  if [ -f "$dir/failed" ] || [ ! -s "$out" ]; then
    fail "$kind $name: could not build or run the verifier"; cat "$dir"/*.out 2>/dev/null | tail -n 20; return
  fi
  local errors violated depth
  errors=$(field '.*errors: ([0-9]+).*' "$out")
  violated=$(field '^pan:1: assertion violated \(+([a-z0-9_]+).*' "$out")
  depth=$(field '.*assertion violated .*\(at depth ([0-9]+)\).*' "$out")
  if [ "${errors:-0}" = "0" ] || [ -z "$violated" ]; then
    if [ "$kind" = mutant ]; then fail "mutant $name: NOT caught (SPIN reports no violation)"
    else fail "witness $name: NOT reached (the model never gets there)"; fi
    return
  fi
  if ! printf '%s\n' "$want" | tr '|' '\n' | grep -qx -- "$violated"; then
    fail "$kind $name: expected a violation of $want, SPIN reported $violated"
    return
  fi
  if [ "$kind" = mutant ]; then
    echo "mutant $name: caught by $violated (counterexample depth $depth)"
    if [ "${CHECK_MODEL_TRAIL:-0}" = 1 ]; then counterexample "$dir"; fi
  else
    echo "witness $name: reached (depth $depth)"
  fi
}

started=$(date +%s)
echo "check-model: $(spin -V 2>/dev/null | head -n 1); $(gcc --version | head -n 1); jobs $jobs_max; work dir $work"

configs=()
[ $do_full = 1 ] && configs+=("${FULL_CONFIGS[@]}")
[ $do_deep = 1 ] && configs+=("${DEEP_CONFIGS[@]}")

# Full-model runs are memory-heavy: one at a time, exhaustive (no BITSTATE), optimised.
n=0
for cfg in "${configs[@]}"; do
  n=$((n + 1))
  # shellcheck disable=SC2086
  run_pan "$work/full$n" "-O2 -DVECTORSZ=256" "-m10000 -w24" $cfg
  report_full "$work/full$n" "$cfg"
done

if [ $do_mutants = 1 ]; then
  # Mutants stop at their first violation (within a few thousand states): compile time dominates, so
  # no optimisation, and a 2^20-slot hash table (-w20) instead of the default 2^24, whose 128 MB took
  # longer to clear than the search. The table's size changes no result: states are stored exactly.
  for entry in "${MUTANTS[@]}" "${WITNESSES[@]}"; do
    read -r name _ <<< "$entry"
    throttle
    run_pan "$work/$name" "-O0" "-m10000 -w20" "-D$name" &
  done
  wait
  for entry in "${MUTANTS[@]}"; do
    read -r name want <<< "$entry"
    report_expected "$work/$name" mutant "$name" "$want"
  done
  for entry in "${WITNESSES[@]}"; do
    read -r name want <<< "$entry"
    report_expected "$work/$name" witness "$name" "$want"
  done
fi

elapsed=$(( $(date +%s) - started ))
if [ $status = 0 ]; then echo "check-model: OK (${elapsed} s)"; else echo "check-model: FAILED (${elapsed} s)"; fi
exit $status
