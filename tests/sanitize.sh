#!/usr/bin/env bash
# `make sanitize`: runs each test binary under each compute-sanitizer tool, JOBS (tool, binary)
# pairs at a time, prints one PASS/FAIL line per pair with its time, keeps the logs under LOGDIR
# and exits non-zero on any finding. Needs a GPU: on a machine without one it fails (a sanitizer
# run that checked nothing must not read as clean).
#
#   tests/sanitize.sh LOGDIR JOBS BINARY...
#   environment: COMPUTE_SANITIZER (the tool's path), SANITIZE_TOOLS (default: all four)
#
# The tests run with TKERN_TEST_UNDER_SANITIZER set to the tool's name: tests with buffers of
# hundreds of MB or more skip themselves, the randomized sweeps run fewer cases, and under
# racecheck the variants whose shared memory is handed over in ways that tool reports as races
# are not forced (tests/support/tk_test.h). Criterion
# runs every test in a process of its own, hence --target-processes all. The sanitizer's exit
# status does not reliably carry the findings of those child processes, so each log is judged
# here: every summary line the tool printed (one per process) must report zero, Criterion's
# synthesis no failure or crash, and the exit status must be 0.
set -uo pipefail

sanitizer_clean() { # tool log: prints the findings, or nothing when every process was clean
    local own='ERROR SUMMARY'
    [ "$1" = racecheck ] && own='RACECHECK SUMMARY'
    grep -q "$own: " "$2" || { echo "no $own line"; return; }
    grep -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+ (error|hazard)s?' "$2" | grep -v ': 0 ' \
        | sed 's/.*: //' | sort | uniq -c \
        | awk '{printf "%s%s process%s: %s %s", sep, $1, ($1 > 1 ? "es" : ""), $2, $3; sep = ", "} END {if (NR) print ""}'
}

criterion_clean() { # log: prints what went wrong, or nothing when every test passed or skipped
    local synthesis
    synthesis=$(grep -oE 'Synthesis: Tested: [0-9]+ \| Passing: [0-9]+ \| Failing: [0-9]+ \| Crashing: [0-9]+' "$1" | tail -n 1)
    if [ -z "$synthesis" ]; then
        echo "no Criterion synthesis"
    elif ! grep -qE 'Failing: 0 \| Crashing: 0$' <<<"$synthesis"; then
        echo "Criterion: ${synthesis#Synthesis: }"
    fi
}

if [ "${1-}" = --one ]; then # one (tool, binary) pair, run by the xargs below
    logdir=$2 tool=$3 binary=$4
    log=$logdir/$tool/$(basename "$binary").log
    mkdir -p "$(dirname "$log")"
    start=$SECONDS
    TKERN_TEST_UNDER_SANITIZER=$tool "$COMPUTE_SANITIZER" --tool "$tool" --target-processes all \
        --print-limit 20 "$binary" --jobs 1 --short-filename --verbose >"$log" 2>&1
    rc=$?
    problems=$(sanitizer_clean "$tool" "$log"; criterion_clean "$log")
    [ $rc -eq 0 ] || problems="exit status $rc${problems:+; $problems}"
    verdict=PASS
    [ -z "$problems" ] || verdict=FAIL
    line=$(printf '%s  %-9s  %-22s %5d s%s' "$verdict" "$tool" "$(basename "$binary")" \
           $((SECONDS - start)) "${problems:+  ${problems//$'\n'/; }  ($log)}")
    echo "$line"
    echo "$line" >>"$logdir/results"
    [ $verdict = PASS ]
    exit
fi

[ $# -ge 3 ] || { echo "usage: $0 LOGDIR JOBS BINARY..." >&2; exit 2; }
logdir=$1 jobs=$2
shift 2
export COMPUTE_SANITIZER=${COMPUTE_SANITIZER:-compute-sanitizer}
tools=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "sanitize: no GPU on this machine (nvidia-smi finds none); compute-sanitizer needs one." >&2
    echo "sanitize: run 'make sanitize' on the GPU machine. Nothing was checked." >&2
    exit 1
fi
command -v "$COMPUTE_SANITIZER" >/dev/null \
    || { echo "sanitize: $COMPUTE_SANITIZER not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)" >&2; exit 1; }

rm -rf "$logdir"
mkdir -p "$logdir"
: >"$logdir/results"
echo "compute-sanitizer $("$COMPUTE_SANITIZER" --version | grep -oE '[0-9]{4}\.[0-9.]+' | head -n 1):" \
     "$tools over $# binaries, $jobs at a time; logs in $logdir/"
start=$SECONDS
# Tool by tool, racecheck first: its runs are the longest (the attention suites take minutes),
# so they start first and the short runs fill the slots beside them.
ordered_tools=$(tr ' ' '\n' <<<"$tools" | grep -x racecheck; tr ' ' '\n' <<<"$tools" | grep -vx racecheck)
for tool in $ordered_tools; do
    for binary in "$@"; do
        printf '%s\0%s\0' "$tool" "$binary"
    done
done | xargs -0 -n 2 -P "$jobs" "$0" --one "$logdir"
runs=$(wc -l <"$logdir/results")
failed=$(grep -c '^FAIL' "$logdir/results")
expected=$(( $# * $(wc -w <<<"$tools") ))
echo "sanitize: $((runs - failed)) of $expected runs clean in $((SECONDS - start)) s"
[ "$failed" -eq 0 ] && [ "$runs" -eq "$expected" ]
