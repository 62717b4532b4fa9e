#!/usr/bin/env bash
# `make test-c`: runs every Criterion suite, JOBS suites at a time, each to its own log under
# LOGDIR; then prints the logs in the order given and one summary line, and exits non-zero if
# any suite failed. Every suite runs even after one fails. Criterion's summary leaves skipped
# tests (GPU tests without a device) out of "Tested" (failed = tested - passed counts crashes
# once), so skipped = the tests a suite lists minus those it tested.
#
#   tests/run_suites.sh LOGDIR JOBS BINARY...
#
# JOBS > 1 is for the GPU machine's many cores: the suites share the GPU, and each test still
# runs alone in its suite (--jobs 1).
set -uo pipefail

if [ "${1-}" = --one ]; then # one suite, run by the xargs below
    log=$2/$(basename "$3")
    "$3" --jobs 1 --short-filename >"$log.log" 2>&1
    rc=$?
    echo "$("$3" --list 2>&1 | grep -c '── ')" >"$log.listed"
    exit $rc
fi

[ $# -ge 3 ] || { echo "usage: $0 LOGDIR JOBS BINARY..." >&2; exit 2; }
logdir=$1 jobs=$2
shift 2
rm -rf "$logdir"
mkdir -p "$logdir"
printf '%s\0' "$@" | xargs -0 -n 1 -P "$jobs" "$0" --one "$logdir"
rc=$?
for t in "$@"; do
    echo "== $t"
    cat "$logdir/$(basename "$t").log"
done
listed=$(cat "$logdir"/*.listed | awk '{ l += $1 } END { print l + 0 }')
cat "$logdir"/*.log | awk -v listed="$listed" '
    /Synthesis:/ { for (i = 1; i <= NF; i++) { if ($i == "Tested:") t += $(i + 1); if ($i == "Passing:") p += $(i + 1) } }
    END { printf "criterion: %d passed, %d failed, %d skipped\n", p, t - p, listed - t }'
[ $rc -eq 0 ]
