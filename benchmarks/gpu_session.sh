#!/usr/bin/env bash
# The GPU machine's batch work, in stages, with logs under $OUT (or build/gpu-logs). Usage, from
# the repository root:
#   benchmarks/gpu_session.sh [ARCHS] [STAGE...]        default: 90a build test bench
# Stages, run in the order given:
#   build     make clean, then the library (ARCHS, warnings as errors)
#   test      make test: the Criterion suites, pytest, the decoder example
#   sanitize  make sanitize: compute-sanitizer's four tools over the GPU suites (past one call on
#             an H100 with 16 cores: SANITIZE_TOOLS=racecheck in one call and
#             SANITIZE_TOOLS="memcheck synccheck initcheck" in the next split it)
#   bench     make bench (BENCH_ARGS passes through, e.g. BENCH_ARGS="--only norm --reps 10")
#   python    bench_vs_torch.py (peers where importable; VS_TORCH_ARGS passes through, e.g.
#             VS_TORCH_ARGS="--tables flash,backward") and bench_overhead.py
# A lent machine runs one command for at most a few minutes, so the whole definition of done
# (build, test, sanitize, bench, python) is usually two or three calls on a machine kept warm.
# Each call gets a fresh copy of the sources, newer than the build left there, so a call
# without the build stage first checks that the sources are those of that build (a hash kept
# in build/.tree-id) and marks the build up to date for make. Criterion is found through
# PKG_CONFIG_PATH (set it to a bundled copy on machines without a package registry). Each stage
# prints its summary and its exit status; the script exits non-zero if any stage failed.
set -uo pipefail
archs=90a
case "${1-}" in [0-9]*) archs=$1; shift ;; esac
stages=${*:-build test bench}
out=${OUT:-build/gpu-logs}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$out/gpu.txt"
jobs=$(nproc)
failed=0

tree_id() { # the sources only: not what running the tests leaves beside them (pytest's caches)
    find Makefile include src cuda tests benchmarks examples python -type f -not -name '*.pyc' \
        -not -path '*/.pytest_cache/*' -not -path '*/__pycache__/*' -not -path '*.egg-info/*' \
        | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-40
}

stage_build() {
    make clean >/dev/null
    mkdir -p "$out"
    make -j"$jobs" ARCHS="$archs" WERROR=1 lib >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; return 1; }
    tree_id >build/.tree-id
}
stage_test() {
    make -j"$jobs" ARCHS="$archs" WERROR=1 TEST_JOBS=8 test >"$out/test.log" 2>&1
    local rc=$?
    grep -E "^== |Synthesis|passed|failed|FAIL|skipped|decoder" "$out/test.log" | grep -v "^\[PASS\]" | tail -40
    return $rc
}
stage_sanitize() {
    make ARCHS="$archs" WERROR=1 sanitize >"$out/sanitize.log" 2>&1
    local rc=$?
    grep -E "^(PASS|FAIL) " "$out/sanitize.log"
    cp -r build/sanitize "$out/sanitize-logs" 2>/dev/null
    return $rc
}
stage_bench() {
    make ARCHS="$archs" bench BENCH_ARGS="${BENCH_ARGS-}" >"$out/bench.log" 2>&1
    local rc=$?
    cp build/bench.jsonl "$out/" 2>/dev/null
    tail -80 "$out/bench.log"
    return $rc
}
stage_python() {
    local lib=$PWD/build/lib/libtkern.so rc=0
    # shellcheck disable=SC2086 # VS_TORCH_ARGS is a list of arguments
    TKERN_LIBRARY=$lib PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 python3 benchmarks/python/bench_vs_torch.py ${VS_TORCH_ARGS-} \
        --out "$out/vs_torch.md" >"$out/vs_torch.log" 2>&1 || rc=1
    TKERN_LIBRARY=$lib PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 python3 benchmarks/python/bench_overhead.py \
        --out "$out/overhead.md" >"$out/overhead.log" 2>&1 || rc=1
    cat "$out/vs_torch.md" "$out/overhead.md" 2>/dev/null | tail -120
    [ $rc -eq 0 ] || tail -20 "$out/vs_torch.log" "$out/overhead.log"
    return $rc
}

for stage in $stages; do
    declare -F "stage_$stage" >/dev/null || { echo "unknown stage: $stage (build test sanitize bench python)"; exit 2; }
done
case " $stages " in
*" build "*) ;;
*) if [ -f build/.tree-id ] && [ "$(cat build/.tree-id)" = "$(tree_id)" ]; then
       find build -type f -exec touch {} +
       echo "reusing the build of these sources"
   else
       echo "no build of these sources here: make builds what the stages need"
   fi ;;
esac
for stage in $stages; do
    start=$SECONDS
    echo "== $stage"
    "stage_$stage"
    rc=$?
    echo "== $stage: exit $rc, $((SECONDS - start)) s"
    [ $rc -eq 0 ] || failed=1
done
exit $failed
