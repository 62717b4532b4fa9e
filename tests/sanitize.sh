#!/usr/bin/env bash
# `make sanitize`: runs every test of each test binary under each compute-sanitizer tool, one
# (tool, test) run per job and JOBS jobs at a time, prints one PASS/FAIL line per (tool, binary)
# once all its tests have run (and a failing test's own line as soon as it fails), keeps the logs
# under LOGDIR and exits non-zero on any finding. Needs a GPU: on a machine without one it fails
# (a sanitizer run that checked nothing must not read as clean).
#
#   tests/sanitize.sh LOGDIR JOBS BINARY...
#   environment: COMPUTE_SANITIZER (the tool's path), SANITIZE_TOOLS (default: all four)
#
# A job is one test rather than one binary because a run lasts as long as its longest job: under
# racecheck a whole binary (test_attention_bwd, test_norm) took more than nine minutes on an
# H100, most of it a few tests run one after the other while the other slots stood idle.
#
# The tests run with TKERN_TEST_UNDER_SANITIZER set to the tool's name: tests with buffers of
# hundreds of MB or more skip themselves, the randomized sweeps run fewer cases, and under
# racecheck the variants whose shared memory is handed over in ways that tool reports as races
# are not forced (tests/support/tk_test.h). Criterion runs the test in a process of its own,
# hence --target-processes all. The sanitizer's exit status does not reliably carry the findings
# of that child process, so each log is judged here: every summary line the tool printed (one per
# process) must report zero, Criterion's synthesis no failure or crash, the test must have run
# and passed or skipped (a filter that matched nothing checked nothing), and the exit status must
# be 0. A test that never calls CUDA (argument checks, the CPU references) gives the tool nothing
# to check: compute-sanitizer then says so, exits 255 and prints no summary line; such a run
# (outcome no-cuda) is judged by Criterion alone.
set -uo pipefail

sanitizer_clean() { # tool log: prints the findings, or nothing when every process was clean
    local own='ERROR SUMMARY'
    [ "$1" = racecheck ] && own='RACECHECK SUMMARY'
    grep -q "$own: " "$2" || { echo "no $own line"; return; }
    grep -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+ (error|hazard)s?' "$2" | grep -v ': 0 ' \
        | sed 's/.*: //' | sort | uniq -c \
        | awk '{printf "%s%s process%s: %s %s", sep, $1, ($1 > 1 ? "es" : ""), $2, $3; sep = ", "} END {if (NR) print ""}'
}

# What compute-sanitizer prints when the program it ran never called CUDA.
NO_CUDA_CALL='Target application terminated before first instrumented API call'

criterion_clean() { # log test: prints what went wrong, or nothing when the test passed or skipped
    local synthesis name=${2/\//::}
    synthesis=$(grep -oE 'Synthesis: Tested: [0-9]+ \| Passing: [0-9]+ \| Failing: [0-9]+ \| Crashing: [0-9]+' "$1" | tail -n 1)
    if [ -z "$synthesis" ]; then
        echo "no Criterion synthesis"
    elif ! grep -qE 'Failing: 0 \| Crashing: 0$' <<<"$synthesis"; then
        echo "Criterion: ${synthesis#Synthesis: }"
    elif ! grep -qE "^\[(PASS|SKIP)\] ${name}:" "$1"; then
        echo "Criterion did not run $2"
    fi
}

# Called by a job when its test is done, under the results file's lock: once every test of the
# (tool, binary) pair has a line, the pair's line (PASS when every test's is).
pair_line() { # logdir tool binary
    local mine tests
    tests=$(wc -l <"$1/tests/$3")
    mine=$(awk -v tool="$2" -v bin="$3" '$2 == tool && $3 == bin' "$1/results")
    [ "$(wc -l <<<"$mine")" -eq "$tests" ] || return 0
    awk -v tool="$2" -v bin="$3" '
        { failed += ($1 == "FAIL"); skipped += ($5 == "skipped"); host += ($5 == "no-cuda"); if ($6 > longest) longest = $6 }
        END { printf "%s  %-9s  %-22s %3d tests, %d failed, %d skipped, %d without CUDA calls; the longest %d s\n",
                     (failed ? "FAIL" : "PASS"), tool, bin, NR, failed, skipped, host, longest }' <<<"$mine"
}

if [ "${1-}" = --one ]; then # one (tool, binary, test) job, run by the xargs below
    logdir=$2 tool=$3 binary=$4 test=$5
    name=$(basename "$binary")
    log=$logdir/$tool/$name/${test/\//.}.log
    mkdir -p "$(dirname "$log")"
    start=$SECONDS
    TKERN_TEST_UNDER_SANITIZER=$tool "$COMPUTE_SANITIZER" --tool "$tool" --target-processes all \
        --print-limit 20 "$binary" --filter "$test" --jobs 1 --short-filename --verbose >"$log" 2>&1
    rc=$?
    if grep -qF "$NO_CUDA_CALL" "$log"; then
        problems=$(criterion_clean "$log" "$test") outcome=no-cuda
    else
        problems=$(sanitizer_clean "$tool" "$log"; criterion_clean "$log" "$test")
        [ $rc -eq 0 ] || problems="exit status $rc${problems:+; $problems}"
        outcome=passed
    fi
    verdict=PASS
    [ -z "$problems" ] || verdict=FAIL outcome=failed
    [ $outcome = passed ] && grep -q "^\[SKIP\] ${test/\//::}:" "$log" && outcome=skipped
    line=$(printf '%s  %-9s  %-22s %-60s %-7s %5d s%s' "$verdict" "$tool" "$name" "$test" "$outcome" \
           $((SECONDS - start)) "${problems:+  ${problems//$'\n'/; }  ($log)}")
    {
        flock 9
        echo "$line" >>"$logdir/results"
        [ $verdict = PASS ] || echo "$line"
        pair_line "$logdir" "$tool" "$name"
    } 9>>"$logdir/results.lock"
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
mkdir -p "$logdir/tests"
: >"$logdir/results"
# Each binary's tests as suite/name, the form --filter takes (from Criterion's --list tree).
expected=0
for binary in "$@"; do
    list=$logdir/tests/$(basename "$binary")
    "$binary" --list 2>/dev/null | awk '/^[^ ].*: [0-9]+ tests?$/ { sub(/: [0-9]+ tests?$/, ""); suite = $0; next }
                                         { sub(/^.* /, ""); print suite "/" $0 }' >"$list"
    [ -s "$list" ] || { echo "sanitize: $binary --list named no test" >&2; exit 1; }
    expected=$((expected + $(wc -l <"$list") * $(wc -w <<<"$tools")))
done
echo "compute-sanitizer $("$COMPUTE_SANITIZER" --version | grep -oE '[0-9]{4}\.[0-9.]+' | head -n 1):" \
     "$tools over $# binaries, $expected (tool, test) runs, $jobs at a time; logs in $logdir/"
start=$SECONDS
# Tool by tool, racecheck first: its runs are the longest (an attention test takes minutes), so
# they start first and the short runs fill the slots beside them.
ordered_tools=$(tr ' ' '\n' <<<"$tools" | grep -x racecheck; tr ' ' '\n' <<<"$tools" | grep -vx racecheck)
for tool in $ordered_tools; do
    for binary in "$@"; do
        while read -r test; do
            printf '%s\0%s\0%s\0' "$tool" "$binary" "$test"
        done <"$logdir/tests/$(basename "$binary")"
    done
done | xargs -0 -n 3 -P "$jobs" "$0" --one "$logdir"
runs=$(wc -l <"$logdir/results")
failed=$(grep -c '^FAIL' "$logdir/results")
echo "sanitize: $((runs - failed)) of $expected runs clean in $((SECONDS - start)) s"
[ "$failed" -eq 0 ] && [ "$runs" -eq "$expected" ]
