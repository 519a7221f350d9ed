# run: a small inference engine for Qwen3 checkpoints with a compressed KV cache.
#   make            build ./run, and the shipped model as one file (models/qwen3-kjv-mtp.bin)
#   make run        run the built-in default model
#   make test       build and run the Criterion suite
#   make test-asan  the same suite under AddressSanitizer + UBSan
#   make fuzz       build the libFuzzer harnesses (tests/fuzz/) into build-fuzz/
#   make fuzz-run   run each for FUZZ_SECONDS (default 60) from its seed corpus
#   make bench      measure speed (about 12 minutes)
#   make figures    remake docs/compare-kjv.svg, the README's plot
CC      ?= gcc
OPT     ?= -O3
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -Wall -Wextra -fopenmp -I. -D_GNU_SOURCE
LDLIBS  += -lm -fopenmp

LIB_SRC  := $(sort $(wildcard format/*.c kernels/*.c kv/*.c attn/*.c model/*.c tokenizer/*.c sample/*.c speculative/*.c eval/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
HDRS     := $(wildcard */*.h)

BUILD   ?= build
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all run test test-asan bench clean figures FORCE
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
test: $(BUILD)/run $(BUILD)/test_all $(BUILD)/make_model $(BUILD)/bench $(BUILD)/bench_attn
	OMP_WAIT_POLICY=passive RUN_BIN=$(BUILD)/run TOOLS_DIR=$(BUILD) $(BUILD)/test_all $(TEST_ARGS)

test-asan:
	$(MAKE) test BUILD=build-asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
		LDLIBS="-lm -fopenmp -fsanitize=address,undefined"

$(BUILD)/bench_attn: $(BUILD)/tools/bench_attn.o $(BUILD)/librun.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bench: $(BUILD)/tools/bench.o $(BUILD)/librun.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

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

# Speed is measured here, never asserted in a test. About 12 min on 2
# cores, plus ~25 s to make the three models the first time; other load on
# the cores stretches it. The hybrid (Qwen3.5-0.8B's shape) runs last, on
# 2 threads: prefill beside Qwen3-0.6B's per FLOP, decode at short context
# and at 4K, and the delta rule alone (about 2 min).
bench: $(BUILD)/bench $(BUILD)/bench_attn $(BUILD)/run bench/qwen3-0.6b bench/qwen3-0.6b-mtp bench/qwen3.5-0.8b
	$(BUILD)/bench bench/qwen3-0.6b
	$(BUILD)/bench_attn --layers 28 8192 32768
	RUN_BIN=$(BUILD)/run sh tools/bench_spec.sh
	$(BUILD)/bench bench/qwen3.5-0.8b --threads 2 --ctx 4096 --kv f16 --vs bench/qwen3-0.6b

clean:
	rm -rf build build-asan build-fuzz run models/qwen3-kjv-mtp.bin

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
FUZZ_LIB_SRC := $(sort $(wildcard format/*.c)) model/config.c tokenizer/tokenizer.c tokenizer/unicode.c
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
