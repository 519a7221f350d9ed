# run: a small inference engine for Qwen3 checkpoints with a compressed KV cache.
#   make            build ./run
#   make run        run the built-in default model
#   make test       build and run the Criterion suite
#   make test-asan  the same suite under AddressSanitizer + UBSan
CC      ?= gcc
OPT     ?= -O3
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -Wall -Wextra -fopenmp -I. -D_GNU_SOURCE
LDLIBS  += -lm -fopenmp

LIB_SRC  := $(sort $(wildcard format/*.c kernels/*.c kv/*.c attn/*.c model/*.c tokenizer/*.c sample/*.c spec/*.c eval/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
HDRS     := $(wildcard */*.h)

BUILD   ?= build
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all run test test-asan bench clean
# ./run is a copy of $(BUILD)/run, so that "make run" can be the command that runs it.
all: $(BUILD)/run
	@cp $(BUILD)/run run.tmp && mv -f run.tmp run

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/librun.a: $(LIB_OBJ)
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
# ignored) and reused: tools/make_model.c, 1.2 GB each, ~10 s each.
bench/qwen3-0.6b bench/qwen3-0.6b-mtp: | $(BUILD)/make_model
	rm -rf $@.tmp
	@mkdir -p $(dir $@)
	$(BUILD)/make_model --shape 0.6b $(if $(findstring -mtp,$@),--mtp) --out $@.tmp
	mv $@.tmp $@

# Speed is measured here, never asserted in a test. About 10 min on 2
# cores (measured 9m48s and 10m13s on an AMD EPYC with the models already
# made; making the two models the first time adds ~15 s); other load on the
# cores stretches it.
bench: $(BUILD)/bench $(BUILD)/bench_attn $(BUILD)/run bench/qwen3-0.6b bench/qwen3-0.6b-mtp
	$(BUILD)/bench bench/qwen3-0.6b
	$(BUILD)/bench_attn --layers 28 8192 32768
	RUN_BIN=$(BUILD)/run sh tools/bench_spec.sh

clean:
	rm -rf build build-asan run

# Retrain the shipped default model models/qwen3-kjv-mtp from scratch (fixed
# seed; never run by CI). Needs: apt-get install -y bible-kjv bible-kjv-text
# python3-torch libopenblas0-pthread python3-numpy. About 45 min on 2 cores
# (measured: 44.9 min of training with other jobs running on the machine).
.PHONY: train
train: all
	/usr/bin/python3 tools/prepare_data.py
	nice -n 10 /usr/bin/python3 tools/train.py --fresh
