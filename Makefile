# libtkern build. `make` builds the shared and static library, `make test` builds and runs the
# test suites, `make bench` the benchmarks (GPU needed), `make install` honours PREFIX/DESTDIR.
#
#   make ARCHS=90a           build for one target only (fast iteration on an H100 / H200)
#   make WERROR=1            warnings are errors (CI)
#
# Every .c in src/, .cu in cuda/, tests/test_*.c and benchmarks/*.{c,cu} is picked up by
# wildcard: adding a family needs no edit here. Each .cu compiles on its own, in parallel with
# the others (make -j), so build time grows with the largest file, not with the sum.

.SUFFIXES:
.DELETE_ON_ERROR:

CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc))
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CC        ?= cc
CXX       ?= c++
PREFIX    ?= /usr/local
LIBDIR    ?= $(PREFIX)/lib
INCLUDEDIR?= $(PREFIX)/include
BUILD     ?= build
# GPU targets: NN means SASS for sm_NN, compute_NN means PTX that newer drivers can compile.
ARCHS     ?= 80 86 89 90a compute_90
WERROR    ?= 0
PYTHON    ?= python3

version_part = $(shell sed -n 's/^\#define TK_VERSION_$(1) \([0-9]*\).*/\1/p' include/tkern.h)
MAJOR   := $(call version_part,MAJOR)
MINOR   := $(call version_part,MINOR)
PATCH   := $(call version_part,PATCH)
VERSION := $(MAJOR).$(MINOR).$(PATCH)

ifeq ($(CC),cc)
CC := gcc
endif

gencode = $(if $(filter compute_%,$(1)),-gencode=arch=$(1)$(comma)code=$(1),-gencode=arch=compute_$(1)$(comma)code=sm_$(1))
comma := ,

WARN        := -Wall -Wextra
CWERROR     := $(if $(filter 1,$(WERROR)),-Werror)
NVWERROR    := $(if $(filter 1,$(WERROR)),-Werror all-warnings -Xcompiler -Werror)
CPPFLAGS    += -Iinclude -I$(CUDA_HOME)/include
CFLAGS      ?= -O2 -g
CFLAGS      += -std=c11 -fPIC -fvisibility=hidden $(WARN) $(CWERROR) -DTK_BUILDING_LIBRARY \
               -DTK_COMPILED_ARCHS='"$(ARCHS)"'
NVCCFLAGS   ?= -O3 -lineinfo
NVCCFLAGS   += -std=c++17 $(foreach a,$(ARCHS),$(call gencode,$(a))) \
               -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra -Xptxas --warn-on-spills \
               --expt-relaxed-constexpr $(NVWERROR) -DTK_BUILDING_LIBRARY
LDLIBS_CUDA := -L$(CUDA_HOME)/lib64 -lcudart -lstdc++ -lpthread -lm

LIB_SRC  := $(wildcard src/*.c)
CU_SRC   := $(wildcard cuda/*.cu)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)

SONAME   := libtkern.so.$(MAJOR)
SHARED   := $(BUILD)/lib/libtkern.so.$(VERSION)
STATIC   := $(BUILD)/lib/libtkern.a

.PHONY: all lib test test-c test-python sanitize abi-check abi-baseline bench install uninstall \
        clean examples
all: lib
lib: $(SHARED) $(BUILD)/lib/$(SONAME) $(BUILD)/lib/libtkern.so $(STATIC)

# Each object records the headers it includes (-MMD -MP writes $(BUILD)/obj/.../x.d, read back
# below), so editing one family's header rebuilds that family's files, not the whole library.
$(BUILD)/obj/src/%.o: src/%.c Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/cuda/%.o: cuda/%.cu Makefile
	@mkdir -p $(@D)
	$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) -MMD -MP -c $< -o $@

-include $(LIB_OBJ:.o=.d)

$(SHARED): $(LIB_OBJ) src/tkern.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $(LIB_OBJ) -Wl,-soname,$(SONAME) -Wl,--version-script=src/tkern.map \
	    -Wl,--no-undefined $(LDLIBS_CUDA)

$(BUILD)/lib/$(SONAME) $(BUILD)/lib/libtkern.so: $(SHARED)
	ln -sf $(notdir $(SHARED)) $@

$(STATIC): $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# ---------------------------------------------------------------------------------- tests --
# Test binaries are linked by the host compiler (Criterion's pkg-config flags carry -Wl options
# that nvcc rejects). GPU suites run one test at a time (--jobs 1): they share one device.
CRITERION_CFLAGS = $(shell pkg-config --cflags criterion)
CRITERION_LIBS   = $(shell pkg-config --libs criterion)
TEST_SRC     := $(wildcard tests/test_*.c)
TEST_BIN     := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_SUPPORT := $(wildcard tests/support/*.c tests/ref/*.c)
TEST_CFLAGS  := -std=c11 -O2 -g $(WARN) $(CWERROR) -Itests \
                -DTK_SOURCE_DIR='"$(CURDIR)"' -DTK_BUILD_DIR='"$(abspath $(BUILD))"' \
                -DTK_CC='"$(CC)"' -DTK_CXX='"$(CXX)"' -DTK_CUDA_INCLUDE='"$(CUDA_HOME)/include"' \
                -DTK_COMPILED_ARCHS='"$(ARCHS)"'

$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT) $(wildcard tests/support/*.h tests/ref/*.h) $(SHARED) $(BUILD)/lib/libtkern.so $(BUILD)/lib/$(SONAME)
	@mkdir -p $(@D)
	@pkg-config --exists criterion || { echo "Criterion not found by pkg-config (Debian: apt-get install libcriterion-dev pkg-config)"; exit 1; }
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(CRITERION_CFLAGS) $< $(TEST_SUPPORT) -o $@ \
	    -L$(BUILD)/lib -Wl,-rpath,$(abspath $(BUILD))/lib -ltkern $(CRITERION_LIBS) $(LDLIBS_CUDA)

test: test-c test-python test-examples

# Every suite runs even after one fails (TEST_JOBS at a time: more on the GPU machine, whose
# cores the suites can share); the last line sums them all, and the target fails if any suite
# did (tests/run_suites.sh).
TEST_JOBS ?= 1

test-c: $(TEST_BIN)
	@tests/run_suites.sh $(BUILD)/tests/logs $(TEST_JOBS) $(TEST_BIN)

test-python: lib
	@if command -v $(PYTHON) >/dev/null && $(PYTHON) -c 'import pytest' 2>/dev/null && [ -d python/tests ]; then \
	    TKERN_LIBRARY=$(abspath $(SHARED)) PYTHONPATH=$(CURDIR)/python $(PYTHON) -m pytest -q python/tests; \
	else echo "python tests skipped: python3 with pytest not found"; fi

# ------------------------------------------------------------------------------- sanitize --
# On the GPU machine: every test binary with GPU tests (its source uses TK_REQUIRE_GPU) under
# compute-sanitizer's memcheck, racecheck, synccheck and initcheck, one (tool, test) run per job,
# SANITIZE_JOBS jobs at a time. One PASS/FAIL line per tool and binary, logs in
# $(BUILD)/sanitize/, a non-zero exit on any finding and on a machine without a GPU. Tests with
# buffers of hundreds of MB or more skip themselves there (TK_SKIP_UNDER_SANITIZER,
# tests/support/tk_test.h).
SANITIZE_TOOLS    ?= memcheck racecheck synccheck initcheck
SANITIZE_JOBS     ?= $(shell nproc)
COMPUTE_SANITIZER ?= $(firstword $(wildcard $(CUDA_HOME)/bin/compute-sanitizer \
                       $(CUDA_HOME)/compute-sanitizer/compute-sanitizer) compute-sanitizer)

SANITIZE_BIN      := $(patsubst tests/%.c,$(BUILD)/tests/%,$(shell grep -l TK_REQUIRE_GPU $(TEST_SRC)))

sanitize: $(SANITIZE_BIN)
	@COMPUTE_SANITIZER='$(COMPUTE_SANITIZER)' SANITIZE_TOOLS='$(SANITIZE_TOOLS)' \
	    tests/sanitize.sh $(BUILD)/sanitize $(SANITIZE_JOBS) $(SANITIZE_BIN)

# ------------------------------------------------------------------------------------ abi --
# The ABI gate (CI runs it): `make abi-check` compares the library with the committed baseline,
# libabigail's description of the exported tk_* functions and the public types they reach, read
# from the host objects' debug info (-g). It fails on any difference and names its kind (see
# abi/check.sh); `make abi-baseline` rewrites the baseline from the current build. The baseline
# keeps no paths or source locations, so it does not depend on where the tree was built.
ABI_BASELINE := abi/libtkern.abi
ABIDW_FLAGS  := --headers-dir include --drop-private-types --exported-interfaces-only \
                --drop-undefined-syms --no-show-locs --no-comp-dir-path --no-corpus-path \
                --no-elf-needed --type-id-style hash

abi-check: $(SHARED)
	@abi/check.sh $(ABI_BASELINE) $(SHARED)

abi-baseline: $(SHARED)
	abidw $(ABIDW_FLAGS) --out-file $(ABI_BASELINE) $(SHARED)

# ------------------------------------------------------------------------------ benchmarks --
BENCH_SRC := $(wildcard benchmarks/*.c benchmarks/*.cu)
BENCH_OBJ := $(patsubst %,$(BUILD)/obj/%.o,$(BENCH_SRC))
BENCH_BIN := $(BUILD)/bench/tkbench

$(BUILD)/obj/benchmarks/%.c.o: benchmarks/%.c $(wildcard benchmarks/*.h) include/tkern.h Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -std=c11 -O2 $(WARN) $(CWERROR) -Ibenchmarks -c $< -o $@

$(BUILD)/obj/benchmarks/%.cu.o: benchmarks/%.cu $(wildcard benchmarks/*.h) include/tkern.h Makefile
	@mkdir -p $(@D)
	$(NVCC) $(CPPFLAGS) -std=c++17 -O3 $(foreach a,$(ARCHS),$(call gencode,$(a))) -Xcompiler -Wall,-Wextra $(NVWERROR) -Ibenchmarks -c $< -o $@

$(BENCH_BIN): $(BENCH_OBJ) $(SHARED) $(BUILD)/lib/libtkern.so $(BUILD)/lib/$(SONAME)
	@mkdir -p $(@D)
	$(CC) -o $@ $(BENCH_OBJ) -L$(BUILD)/lib -Wl,-rpath,$(abspath $(BUILD))/lib -ltkern \
	    -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas $(LDLIBS_CUDA)

bench: $(BENCH_BIN)
	$(BENCH_BIN) --json $(BUILD)/bench.jsonl $(BENCH_ARGS)

# ------------------------------------------------------------------------------- examples --
.PHONY: test-examples
examples: $(BUILD)/examples/activation $(BUILD)/examples/decoder_layer

# The decoder layer's correctness mode against its CPU layer, on a GPU machine. Without a GPU
# (no working nvidia-smi, or the program's exit status 2: no usable CUDA device) it is skipped.
test-examples: $(BUILD)/examples/decoder_layer
	@if ! nvidia-smi >/dev/null 2>&1; then echo "decoder_layer --check skipped: no GPU (nvidia-smi)"; \
	else $(BUILD)/examples/decoder_layer --check; rc=$$?; \
	    if [ $$rc -eq 2 ]; then echo "decoder_layer --check skipped: no usable CUDA device"; \
	    elif [ $$rc -ne 0 ]; then exit $$rc; fi; fi

$(BUILD)/examples/%: examples/%.c $(SHARED) $(BUILD)/lib/libtkern.so $(BUILD)/lib/$(SONAME)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -std=c11 $(WARN) $(CWERROR) $< -o $@ -L$(BUILD)/lib -Wl,-rpath,$(abspath $(BUILD))/lib -ltkern $(LDLIBS_CUDA)

# --------------------------------------------------------------------------------- corpus --
# One JSON line per shipped kernel variant: math, design, source ranges, latest bench ratios.
.PHONY: corpus
corpus:
	$(PYTHON) docs/corpus.py --out $(BUILD)/corpus.jsonl --bench $(BUILD)/bench.jsonl

# -------------------------------------------------------------------------------- install --
install: lib
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 644 include/tkern.h $(DESTDIR)$(INCLUDEDIR)/tkern.h
	install -m 755 $(SHARED) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(SHARED)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libtkern.so
	install -m 644 $(STATIC) $(DESTDIR)$(LIBDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
	    -e 's|@VERSION@|$(VERSION)|g' -e 's|@CUDA_LIBDIR@|$(CUDA_HOME)/lib64|g' libtkern.pc.in \
	    > $(DESTDIR)$(LIBDIR)/pkgconfig/tkern.pc

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/tkern.h $(DESTDIR)$(LIBDIR)/libtkern.so* \
	      $(DESTDIR)$(LIBDIR)/libtkern.a $(DESTDIR)$(LIBDIR)/pkgconfig/tkern.pc

clean:
	rm -rf $(BUILD)
