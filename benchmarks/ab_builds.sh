#!/usr/bin/env bash
# A change timed beside the library it changes, in one call on the GPU machine: the tree's own
# library and tkbench are built in build/, each candidate's library in build/ab/NAME (a copy of
# the tree with the candidate's files laid over it, the tree's objects reused so that make
# rebuilds only what those files touch). Each candidate's tests run first, on its own build; a
# candidate whose tests fail or time out is left out of the timing. Then one tkbench binary runs
# against each library in turn, round after round, so that every round sees every build under
# the same clocks and the spread between rounds reads beside the differences between builds.
#
#   benchmarks/ab_builds.sh [-a ARCHS] [-r ROUNDS] [-t TEST]... -b "TKBENCH ARGS" CANDIDATE...
#
# CANDIDATE: a directory holding the candidate's files at their repository paths (NAME is its
# base name); benchmarks/ab_overlay.sh writes one from a git ref. -t names a test binary
# (test_softmax) to build and run on each candidate; -b passes arguments to tkbench (--only,
# --shape, --reps); TKERN_FORCE_VARIANT and the like pass through the environment. Logs under
# $OUT (or build/ab-logs): time.txt holds the rounds, build-NAME.log and test-NAME.log the rest.
# A candidate's library is found through LD_LIBRARY_PATH, which the dynamic loader searches
# ahead of tkbench's RUNPATH; each round's header line names the library directory. Each test
# binary runs under a limit of TEST_LIMIT seconds (default 300) and each tkbench run under
# BENCH_LIMIT (default 120), so that a candidate that hangs the GPU costs minutes, not the call.
set -uo pipefail
archs=90a rounds=2 tests=() bench_args=""
test_limit=${TEST_LIMIT:-300} bench_limit=${BENCH_LIMIT:-120}
while getopts "a:r:t:b:" opt; do
    case $opt in
    a) archs=$OPTARG ;;
    r) rounds=$OPTARG ;;
    t) tests+=("$OPTARG") ;;
    b) bench_args=$OPTARG ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { sed -n '2,20p' "$0"; exit 2; }
out=$(realpath -m "${OUT:-build/ab-logs}")
mkdir -p "$out"
jobs=$(nproc)
root=$PWD

make clean >/dev/null
make -j"$jobs" ARCHS="$archs" WERROR=1 lib build/bench/tkbench >"$out/build-tree.log" 2>&1 ||
    { tail -30 "$out/build-tree.log"; exit 1; }
echo "tree built ($SECONDS s)"

names=()
for cand in "$@"; do
    name=$(basename "$cand")
    dir=build/ab/$name
    mkdir -p "$dir/build"
    cp -a Makefile include src cuda tests "$dir/"
    cp -a build/obj build/lib "$dir/build/"
    cp -a "$cand/." "$dir/"
    (cd "$cand" && find . -type f -exec touch "$root/$dir/{}" \;)
    (cd "$dir" && make -j"$jobs" ARCHS="$archs" WERROR=1 lib "${tests[@]/#/build/tests/}") \
        >"$out/build-$name.log" 2>&1 || { tail -30 "$out/build-$name.log"; exit 1; }
    names+=("$name")
    echo "$name built ($SECONDS s)"
done

passed=()
for name in "${names[@]}"; do
    ok=1
    for t in "${tests[@]}"; do
        (cd "build/ab/$name" && timeout "$test_limit" "build/tests/$t" --jobs 4) >>"$out/test-$name.log" 2>&1
        status=$?
        echo "$name $t: exit $status ($(grep -o 'Tested: .*' "$out/test-$name.log" | tail -1))"
        [ $status -eq 0 ] || ok=0
    done
    if [ $ok -eq 1 ]; then passed+=("$name"); else echo "$name: left out of the timing"; fi
done

for ((r = 1; r <= rounds; r++)); do
    for lib in build/lib "${passed[@]/#/build/ab/}"; do
        [ "$lib" = build/lib ] || lib=$lib/build/lib
        echo "== round $r: $lib" >>"$out/time.txt"
        # shellcheck disable=SC2086 # bench_args is a list of arguments
        LD_LIBRARY_PATH=$root/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout "$bench_limit" \
            build/bench/tkbench $bench_args >>"$out/time.txt" 2>&1 ||
            echo "$lib: tkbench exit $? in round $r" | tee -a "$out/time.txt"
    done
done
echo "timed ($SECONDS s)"
grep -vE '^(libtkern|ratio|op |$)' "$out/time.txt"
