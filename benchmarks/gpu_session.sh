#!/usr/bin/env bash
# One batch for a lent GPU machine: clean build, the whole test suite, the benchmarks, and the
# Python comparison, with logs under $OUT (or build/gpu-logs). Usage, from the repository root:
#   benchmarks/gpu_session.sh [ARCHS] [bench families, e.g. "activation,gemm" or "" for all]
# Criterion is found through PKG_CONFIG_PATH (set it to a bundled copy on machines without
# a package registry). Prints a short summary last.
set -uo pipefail
archs=${1:-90a}
only=${2:-}
out=${OUT:-build/gpu-logs}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"

start=$(date +%s)
make clean >/dev/null
make -j"$(nproc)" ARCHS="$archs" WERROR=1 lib > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

make -j"$(nproc)" ARCHS="$archs" WERROR=1 TEST_JOBS=8 test > "$out/test.log" 2>&1
test_rc=$?
grep -E "^== |Synthesis|passed|failed|FAIL|skipped" "$out/test.log" | grep -v "^\[PASS\]" | tail -40

bench_args=${only:+--only $only}
make ARCHS="$archs" bench BENCH_ARGS="$bench_args" > "$out/bench.log" 2>&1
bench_rc=$?
cp build/bench.jsonl "$out/" 2>/dev/null
cat "$out/bench.log" | tail -60
echo "test rc=$test_rc bench rc=$bench_rc"
