# run: a small inference engine for Qwen3 checkpoints with a compressed KV cache.
#   make            build ./run, and the shipped model as one file (models/qwen3-kjv-mtp.bin)
#   make run        run the built-in default model
#   make test       build and run the Criterion suite
#   make test-asan  the same suite under AddressSanitizer + UBSan
#   make aarch64    cross-build build-aarch64/run (NEON kernels; docs/arm.md)
#   make test-aarch64  the kernel, KV, model and golden-logit tests on aarch64
#                   under qemu-user on two emulated CPUs, and the shipped
#                   model's greedy tokens and logits against this machine's
#                   (about 10 minutes)
#   make fuzz       build the libFuzzer harnesses (tests/fuzz/) into build-fuzz/
#   make fuzz-run   run each for FUZZ_SECONDS (default 60) from its seed corpus
#   make bench      measure speed (about 12 minutes)
#   make bench-serve the server's speed: users at once, prefix reuse (about 10 minutes)
#   make bench-cuda the CUDA path's speed (needs a GPU; docs/cuda.md)
#   make gpu-build  build-gpu/: what tools/gpu-check.sh runs on a GPU machine
#   make figures    remake docs/compare-kjv.svg, the README's plot
CC      ?= gcc
OPT     ?= -O3
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -Wall -Wextra -fopenmp -I. -D_GNU_SOURCE
LDLIBS  += -lm -fopenmp

LIB_SRC  := $(sort $(wildcard format/*.c kernels/*.c kv/*.c attn/*.c model/*.c tokenizer/*.c sample/*.c speculative/*.c eval/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
HDRS     := $(wildcard */*.h)

# The server (./run -m serve, serve/; docs/serve.md), built in whenever
# libmicrohttpd is found (Debian: libmicrohttpd-dev); SERVE=0 builds without it.
SERVE      ?= $(shell (pkg-config --exists libmicrohttpd || test -f /usr/include/microhttpd.h) 2>/dev/null \
	&& echo 1 || echo 0)
SERVE_LIBS := $(if $(filter 1,$(SERVE)),-lmicrohttpd -lpthread)
ifeq ($(SERVE),1)
LIB_SRC  += $(sort $(wildcard serve/*.c))
CFLAGS   += -DUSE_SERVE
LDLIBS   += $(SERVE_LIBS)
endif

BUILD   ?= build
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)

# The CUDA path (the .cu files; docs/cuda.md), compiled in
# whenever nvcc is found: CUDA=0 builds without it. The runtime is linked
# statically, so the binary also starts on machines with no GPU or driver
# (and runs on the CPU there). SASS for each of CUDA_ARCHS, plus PTX of the
# oldest and of 90 (the first with programmatic dependent launch), which the
# driver compiles for any later GPU without SASS here (sm_100, sm_110, ...).
CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA       ?= $(if $(NVCC),1,0)
CUDA_ARCHS ?= 80 86 89 90 120 121
ifeq ($(CUDA),1)
CU_SRC   := $(sort $(wildcard kernels/*.cu kv/*.cu attn/*.cu sample/*.cu))
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
LIB_OBJ  += $(CU_OBJ)
CFLAGS   += -DUSE_CUDA
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
NVFLAGS  ?= -O3 -std=c++17 -lineinfo --threads 0 -Xcompiler -Wall,-Wextra --Werror all-warnings
PTX_ARCHS := $(sort $(firstword $(CUDA_ARCHS)) $(filter 90,$(CUDA_ARCHS)))
NVGENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
	$(foreach a,$(PTX_ARCHS),-gencode arch=compute_$(a),code=compute_$(a))
$(BUILD)/%.cu.o: %.cu $(HDRS) $(wildcard */*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(NVGENCODE) -I. -DUSE_CUDA \
		-DCUDA_ARCH_LIST='"$(foreach a,$(CUDA_ARCHS),sm_$(a))"' -c $< -o $@
endif
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all run test test-asan test-plain aarch64 test-aarch64 bench bench-serve bench-cuda gpu-build clean figures FORCE
# ./run is a copy of $(BUILD)/run, so that "make run" can be the command that runs it.
all: $(BUILD)/run models/qwen3-kjv-mtp.bin
	@cp $(BUILD)/run run.tmp && mv -f run.tmp run

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# The commit ./run is built from, for --version: the header is rewritten
# only when it changes, so run.o is rebuilt exactly then.
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
$(BUILD)/version.h: FORCE
	@mkdir -p $(BUILD)
	@echo '#define RUN_VERSION "$(VERSION)"' > $@.tmp
	@if cmp -s $@.tmp $@; then rm $@.tmp; else mv $@.tmp $@; fi

$(BUILD)/run.o: run.c $(BUILD)/version.h $(HDRS)
	$(CC) $(CFLAGS) -include $(BUILD)/version.h -c $< -o $@

# The shipped model as a single file (./run -m pack), as people run models.
models/qwen3-kjv-mtp.bin: $(wildcard models/qwen3-kjv-mtp/*) $(BUILD)/run
	$(BUILD)/run models/qwen3-kjv-mtp -m pack -o $@

# made anew each time, so a source file renamed away leaves no old member behind
$(BUILD)/librun.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/run: $(BUILD)/run.o $(BUILD)/librun.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

run: all
	./run

$(BUILD)/test_all: $(TEST_OBJ) $(BUILD)/librun.a
	$(CC) $(CFLAGS) -o $@ $^ -lcriterion $(LDLIBS)

# Tests run from the repo root (they read tests/data/); CLI tests run $(RUN_BIN),
# and the tools' tests the binaries in $(TOOLS_DIR).
# Criterion runs tests in parallel processes: passive OpenMP waiting keeps
# their threads from spinning against each other on a small machine.
test: $(BUILD)/run $(BUILD)/test_all $(BUILD)/make_model $(BUILD)/bench $(BUILD)/bench_attn $(BUILD)/bench_serve \
	$(if $(filter 1,$(CUDA)),$(BUILD)/bench_cuda)
	OMP_WAIT_POLICY=passive RUN_BIN=$(BUILD)/run TOOLS_DIR=$(BUILD) $(BUILD)/test_all $(TEST_ARGS)

test-asan:
	$(MAKE) test BUILD=build-asan CUDA=0 \
		OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
		LDLIBS="-lm -fopenmp -fsanitize=address,undefined $(SERVE_LIBS)"

# The same test sources without Criterion: tests/runner/ is a small runner
# for the part of Criterion's API they use (a process per test, timeouts),
# for where Criterion cannot run (aarch64 under qemu-user, below).
# PLAIN_TESTS picks the files (PLAIN_CFLAGS is added to their flags);
# test-plain runs them here.
PLAIN_TESTS ?= $(TEST_SRC)
PLAIN_OBJ   := $(patsubst %.c,$(BUILD)/plain/%.o,$(PLAIN_TESTS) tests/runner/main.c)

$(BUILD)/plain/%.o: %.c $(HDRS) tests/runner/criterion/criterion.h
	@mkdir -p $(dir $@)
	$(CC) -Itests/runner $(CFLAGS) $(PLAIN_CFLAGS) -c $< -o $@

$(BUILD)/test_plain: $(PLAIN_OBJ) $(BUILD)/librun.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

test-plain: $(BUILD)/run $(BUILD)/test_plain $(BUILD)/make_model $(BUILD)/bench $(BUILD)/bench_attn $(BUILD)/bench_serve \
	$(if $(filter 1,$(CUDA)),$(BUILD)/bench_cuda)
	OMP_WAIT_POLICY=passive RUN_BIN=$(BUILD)/run TOOLS_DIR=$(BUILD) $(BUILD)/test_plain $(TEST_ARGS)

# aarch64 (docs/arm.md): cross-built with Debian's gcc-aarch64-linux-gnu and
# run under qemu-user (apt-get install gcc-aarch64-linux-gnu
# libc6-dev-arm64-cross qemu-user), on two emulated CPUs (below). The emulated
# tests are the kernel, KV, model, Qwen3.5, golden-logit, loading, format,
# tokenizer and compare-output files on the plain runner (Criterion's
# per-test sandbox cannot start under qemu-user), less four tests too long
# for emulation (AARCH64_EXCLUDE: three drive ./run for minutes, one runs
# every scheme twice); the CLI's own test files stay native (they pass
# emulated too, in 6 more minutes: AARCH64_TESTS="$(wildcard tests/test_*.c)"
# less test_tools.c, which builds and times the benchmark tools). Then the shipped model's 32
# greedy tokens with -kv f32 must be this machine's, and every scheme's
# logits with plain C kernels this machine's plain C ones to the bit, with
# SIMD kernels its SIMD ones within a bound (tests/arm_logits.sh). Every
# emulated step runs under
# timeout -s KILL: a hang fails, never stalls.
AARCH64_CC      ?= aarch64-linux-gnu-gcc
AARCH64_BUILD   ?= build-aarch64
AARCH64_SYSROOT ?= /usr/aarch64-linux-gnu
QEMU_AARCH64    ?= qemu-aarch64
AARCH64_TESTS   ?= tests/test_kernels.c tests/test_deltanet.c tests/test_kv.c tests/test_kv_quant.c \
	tests/test_kv_rotated.c tests/test_model.c tests/test_shipped.c tests/test_qwen35.c tests/test_load.c \
	tests/test_format.c tests/test_tokenizer.c tests/test_compare.c
AARCH64_EXCLUDE ?= shipped/greedy_spec_exact qwen35/greedy_speculation_and_every_scheme \
	qwen35/speculative_decoding_restores_the_state model/batching_does_not_change_logits
# Seconds for each emulated step; a test's own .timeout is stretched 10x,
# one without gets 300 s (emulation runs the kernels 10-50x slower).
AARCH64_TIMEOUT ?= 1200
AARCH64_TEST_ARGS ?= --verbose -j 2 --timeout 300 --timeout-scale 10 $(AARCH64_EXCLUDE:%=--exclude %)
AARCH64_PROMPT  ?= And God said
AARCH64_EMU      = timeout -s KILL $(AARCH64_TIMEOUT) env QEMU_LD_PREFIX=$(AARCH64_SYSROOT) $(QEMU_AARCH64)
# The two emulated CPUs (QEMU_CPU, which the run-qemu wrapper passes on
# too): qemu's "max", with every extension (kernels dotprod with bf16 and
# i8mm), and a
# Cortex-A57, Armv8.0 without the dot product (kernels neon), where the
# kernel and KV tests run again to check the fall-backs are chosen and right.
AARCH64_CPU_FULL ?= max
AARCH64_CPU_BASE ?= cortex-a57
AARCH64_BASE_TESTS ?= kernels/* deltanet/* kv/* kv_quant/* kv_rotated/* model/golden* shipped/golden* \
	qwen35/golden* qwen35/prefill_and_decode_give_the_same_bits
# The tests without loop vectorization: Debian 12's aarch64 gcc 12.2 stops
# with an internal compiler error (vect_transform_reduction) on their fmax
# reductions of differences (tests/test_kernels.c, test_deltanet.c).
AARCH64_MAKE     = $(MAKE) BUILD=$(AARCH64_BUILD) CUDA=0 SERVE=0 CC=$(AARCH64_CC) PLAIN_TESTS="$(AARCH64_TESTS)" \
	PLAIN_CFLAGS=-fno-tree-loop-vectorize

aarch64:
	$(AARCH64_MAKE) $(AARCH64_BUILD)/run

test-aarch64: $(BUILD)/run
	$(AARCH64_MAKE) $(AARCH64_BUILD)/run $(AARCH64_BUILD)/test_plain
	printf '#!/bin/sh\nexec env QEMU_LD_PREFIX=%s %s "$$(dirname "$$0")/run" "$$@"\n' \
		'$(AARCH64_SYSROOT)' '$(QEMU_AARCH64)' > $(AARCH64_BUILD)/run-qemu
	chmod +x $(AARCH64_BUILD)/run-qemu
	# (not tee /dev/stderr: where stderr is a log file, tee reopens it and truncates it)
	v=$$(QEMU_CPU=$(AARCH64_CPU_FULL) $(AARCH64_EMU) $(AARCH64_BUILD)/run --version) && echo "$$v" >&2 && \
		echo "$$v" | grep -q 'kernels dotprod with bf16, i8mm'
	v=$$(QEMU_CPU=$(AARCH64_CPU_BASE) $(AARCH64_EMU) $(AARCH64_BUILD)/run --version) && echo "$$v" >&2 && \
		echo "$$v" | grep -q 'kernels neon'
	QEMU_CPU=$(AARCH64_CPU_FULL) OMP_WAIT_POLICY=passive RUN_BIN=$(AARCH64_BUILD)/run-qemu \
		$(AARCH64_EMU) $(AARCH64_BUILD)/test_plain $(AARCH64_TEST_ARGS)
	QEMU_CPU=$(AARCH64_CPU_BASE) OMP_WAIT_POLICY=passive RUN_BIN=$(AARCH64_BUILD)/run-qemu \
		$(AARCH64_EMU) $(AARCH64_BUILD)/test_plain $(AARCH64_TEST_ARGS) $(AARCH64_BASE_TESTS:%=--filter '%')
	$(BUILD)/run models/qwen3-kjv-mtp -i "$(AARCH64_PROMPT)" -n 32 -t 0 -kv f32 > $(AARCH64_BUILD)/greedy-native.txt
	for cpu in $(AARCH64_CPU_FULL) $(AARCH64_CPU_BASE); do \
		QEMU_CPU=$$cpu $(AARCH64_EMU) $(AARCH64_BUILD)/run models/qwen3-kjv-mtp -i "$(AARCH64_PROMPT)" -n 32 -t 0 -kv f32 \
			> $(AARCH64_BUILD)/greedy-aarch64.txt && \
		cmp $(AARCH64_BUILD)/greedy-native.txt $(AARCH64_BUILD)/greedy-aarch64.txt || exit 1; \
	done
	@echo "aarch64 greedy tokens (-kv f32, both CPUs) are this machine's: $$(cat $(AARCH64_BUILD)/greedy-aarch64.txt)"
	QEMU_CPU=$(AARCH64_CPU_FULL) sh tests/arm_logits.sh $(BUILD)/run "$(AARCH64_EMU) $(AARCH64_BUILD)/run" $(AARCH64_BUILD)

$(BUILD)/bench_attn: $(BUILD)/tools/bench_attn.o $(BUILD)/librun.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bench: $(BUILD)/tools/bench.o $(BUILD)/librun.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bench_serve: $(BUILD)/tools/bench_serve.o
	$(CC) $(CFLAGS) -o $@ $^ -lpthread

$(BUILD)/bench_cuda: $(BUILD)/tools/bench_cuda.o $(BUILD)/librun.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# The CUDA path's speed (tools/bench_cuda.c; needs a GPU, about two minutes).
bench-cuda: $(BUILD)/bench_cuda
	$(BUILD)/bench_cuda

# What tools/gpu-check.sh runs on a GPU machine, built here into
# GPU_BUILD: ./run, the CUDA tests on the plain runner (no Criterion
# needed there) and the benchmark; without the server, whose library
# the GPU machine may not have.
GPU_BUILD ?= build-gpu
gpu-build:
	$(MAKE) BUILD=$(GPU_BUILD) SERVE=0 PLAIN_TESTS=tests/test_cuda.c $(GPU_BUILD)/run $(GPU_BUILD)/test_plain \
		$(GPU_BUILD)/bench_cuda

$(BUILD)/make_model: $(BUILD)/tools/make_model.o
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# Random-weight benchmark models, made on first use outside git (/bench/ is
# ignored) and reused: tools/make_model.c, 1.2 GB each (the hybrid 1.5 GB),
# ~10 s each.
bench/qwen3-0.6b bench/qwen3-0.6b-mtp bench/qwen3.5-0.8b: | $(BUILD)/make_model
	rm -rf $@.tmp
	@mkdir -p $(dir $@)
	$(BUILD)/make_model --shape $(if $(findstring qwen3.5,$@),qwen3.5-0.8b,0.6b) $(if $(findstring -mtp,$@),--mtp) \
		--out $@.tmp
	mv $@.tmp $@

# Speed is measured here, never asserted in a test. Long: Qwen3-0.6B's
# shape first, every compressed scheme and f16 at 4K, 16K and 32K cached
# positions (14 GB of caches at 32K) and a prefill after 16K, which at 2
# threads alone took 12.5 min on 2 cores (docs/speed.md), here at 1 thread
# too; ~25 s to make the three models the first time; other load on the
# cores stretches it. The hybrid (Qwen3.5-0.8B's shape) runs last, on 2
# threads: prefill beside Qwen3-0.6B's per FLOP, decode at short context
# and at 4K, and the delta rule alone (about 4 min).
BENCH_KV = f16,q8,q4,q4h,tbq4,tbq3,tbq2,polar4,lm3,kivi2,kivi4
bench: $(BUILD)/bench $(BUILD)/bench_attn $(BUILD)/run bench/qwen3-0.6b bench/qwen3-0.6b-mtp bench/qwen3.5-0.8b
	$(BUILD)/bench bench/qwen3-0.6b --kv $(BENCH_KV)
	$(BUILD)/bench_attn --layers 28 8192 32768
	RUN_BIN=$(BUILD)/run sh tools/bench_spec.sh
	$(BUILD)/bench bench/qwen3.5-0.8b --threads 2 --ctx 4096 --kv f16 --vs bench/qwen3-0.6b

# The server as its users see it (tools/bench_serve.c): aggregate tok/s,
# time to first token and the gaps between tokens at 1, 4, 16 and 32
# users, f16 and tbq4 caches, the shipped model then Qwen3-0.6B's shape;
# then a 2K-token document's first token cold and warm (prefix reuse).
# About 10 minutes on 2 cores.
bench-serve: $(BUILD)/bench_serve $(BUILD)/run bench/qwen3-0.6b
	RUN_BIN=$(BUILD)/run $(BUILD)/bench_serve models/qwen3-kjv-mtp --tokens 64 --prefix 320
	RUN_BIN=$(BUILD)/run $(BUILD)/bench_serve bench/qwen3-0.6b --tokens 128

clean:
	rm -rf build build-asan build-fuzz build-aarch64 build-gpu run models/qwen3-kjv-mtp.bin

# The README's plot, from the command the README shows.
figures: all
	./run -m compare -f tools/data/heldout.txt -c 512 -n 64 -o docs/compare-kjv.svg

# Fuzzing: libFuzzer harnesses over the code that reads hostile files and
# text (tests/fuzz/fuzz_*.c, one binary each). They need clang's libFuzzer
# and only the loaders and the tokenizer, which use no OpenMP, so only those
# sources are built here, with coverage instrumentation, ASan and UBSan (UB
# aborts, so libFuzzer reports it as a crash).
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS  := -O1 -g -fno-omit-frame-pointer -std=c11 -Wall -Wextra -I. -D_GNU_SOURCE \
	-fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_LIB_SRC := $(sort $(wildcard format/*.c)) model/config.c tokenizer/tokenizer.c tokenizer/unicode.c \
	tokenizer/chat.c serve/request.c kv/kvfile.c
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ_BUILD)/obj/%.o)
FUZZ_BIN     := $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))

.PHONY: fuzz fuzz-run
fuzz: $(FUZZ_BIN)

$(FUZZ_BUILD)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BIN): $(FUZZ_BUILD)/%: tests/fuzz/%.c $(FUZZ_LIB_OBJ) $(HDRS) $(wildcard tests/fuzz/*.h)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB_OBJ) -lm

# Each harness seeded by its git corpus, new inputs in a scratch directory
# (tests/fuzz/run.sh): fails on any crash, leak, timeout or property
# failure, whose input it keeps in $(FUZZ_BUILD)/artifacts/.
fuzz-run: fuzz
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_BUILD=$(FUZZ_BUILD) sh tests/fuzz/run.sh

# Retrain the shipped default model models/qwen3-kjv-mtp from scratch (fixed
# seed; never run by CI). Needs: apt-get install -y bible-kjv bible-kjv-text
# python3-torch libopenblas0-pthread python3-numpy. About 45 min on 2 cores.
.PHONY: train
train: all
	/usr/bin/python3 tools/prepare_data.py
	nice -n 10 /usr/bin/python3 tools/train.py --fresh

# Retrain the shipped hybrid models/qwen35-kjv-mtp (Qwen3.5: Gated DeltaNet +
# gated attention + MTP) the same way: same data, schedule and seed. About 40
# min on 2 cores; never run by CI.
.PHONY: train-hybrid
train-hybrid: all
	/usr/bin/python3 tools/prepare_data.py
	nice -n 10 /usr/bin/python3 tools/train_hybrid.py --fresh
