# orchid — build, set-up, test and benchmark entry points. `make help` lists them.
#
# Layout: every src/**/*.c except src/app/ goes into build/liborchid.a; src/app/*.c
# is the CLI (build/orchid). Each tests/unit/test_*.c is its own test program linked
# against the library. src/cuda/*.cu is compiled with nvcc when nvcc exists
# (CUDA=1, the default then); `make cpu` or CUDA=0 builds without it.
# A second tree, build/asan/, holds the same code built with ASan+UBSan for tests.

.DEFAULT_GOAL := all
SHELL := /bin/bash

BUILD   ?= build
CC      ?= cc
PY      := .venv/bin/python
NVCC    ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
CUDA    ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
ARCHFLAGS ?= -march=native

WARN    := -Wall -Wextra -Wno-unused-parameter
CFLAGS_COMMON := -std=c11 -D_GNU_SOURCE $(WARN) -g -MMD -MP -Isrc -pthread
LIBS    := -lmicrohttpd -lcjson -lpcre2-8 -lutf8proc -lm -lpthread

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/app/*' | sort)
APP_SRC  := $(sort $(wildcard src/app/*.c))
CU_SRC   := $(sort $(wildcard src/cuda/*.cu))
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))

ifeq ($(CUDA),1)
  CFLAGS_CUDA := -DORCHID_CUDA=1
  # NVCC_GENCODE / NVCC_EXTRA: e.g. a timeline build for the H200 only,
  #   make BUILD=build-trace NVCC_GENCODE='-gencode arch=compute_90a,code=sm_90a' NVCC_EXTRA=-DORCHID_TRACE
  NVCC_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
  NVCCFLAGS := -O3 -std=c++17 -Isrc -DORCHID_CUDA=1 -lineinfo $(NVCC_GENCODE) $(NVCC_EXTRA) \
      -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
  CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/%.o)
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcudart_static -ldl -lrt -lstdc++
else
  CU_OBJ :=
  CUDA_LIBS :=
endif

CFLAGS := $(CFLAGS_COMMON) -O2 $(ARCHFLAGS) $(CFLAGS_CUDA)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
APP_OBJ := $(APP_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)

# Sanitizer tree (CPU only: ASan and the CUDA runtime do not mix well).
ASAN := build/asan
ASAN_CFLAGS := $(CFLAGS_COMMON) -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_LIB_OBJ := $(LIB_SRC:%.c=$(ASAN)/%.o)
ASAN_APP_OBJ := $(APP_SRC:%.c=$(ASAN)/%.o)
ASAN_TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(ASAN)/tests/%)

.PHONY: all cpu asan setup run test test-unit test-python test-gpu bench-gpu clean help models

all: $(BUILD)/orchid $(TEST_BIN)

cpu:
	$(MAKE) CUDA=0 all

# The flags a tree was built with: switching CUDA=0/1 (or CC, ARCHFLAGS) rebuilds it.
FLAGS_STAMP := $(BUILD)/.flags
$(shell mkdir -p $(BUILD); echo '$(CC) $(CFLAGS) $(NVCC) $(NVCCFLAGS)' | cmp -s - $(FLAGS_STAMP) || echo '$(CC) $(CFLAGS) $(NVCC) $(NVCCFLAGS)' > $(FLAGS_STAMP))

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(FLAGS_STAMP) $(wildcard src/cuda/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/liborchid.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/orchid: $(APP_OBJ) $(BUILD)/liborchid.a $(FLAGS_STAMP)
	$(CC) $(CFLAGS) -o $@ $(APP_OBJ) $(BUILD)/liborchid.a $(LIBS) $(CUDA_LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/liborchid.a tests/unit/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(BUILD)/liborchid.a $(LIBS) $(CUDA_LIBS)

$(ASAN)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -c $< -o $@

$(ASAN)/liborchid.a: $(ASAN_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(ASAN)/orchid: $(ASAN_APP_OBJ) $(ASAN)/liborchid.a
	$(CC) $(ASAN_CFLAGS) -o $@ $(ASAN_APP_OBJ) $(ASAN)/liborchid.a $(LIBS)

$(ASAN)/tests/%: tests/unit/%.c $(ASAN)/liborchid.a tests/unit/check.h
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -Itests/unit -o $@ $< $(ASAN)/liborchid.a $(LIBS)

asan: $(ASAN)/orchid $(ASAN_TEST_BIN)

setup:
	@scripts/setup.sh

# The default model `make run` serves: a tiny random model of the real architecture.
models/tiny/config.json: tools/make_test_model.py | setup
	$(PY) tools/make_test_model.py --config tiny --out models/tiny

models: models/tiny/config.json

run: setup all models/tiny/config.json
	$(BUILD)/orchid serve --model models/tiny

test: setup
	@$(MAKE) --no-print-directory all asan fuzz-build
	@scripts/run_tests.sh

test-unit: all asan
	@scripts/run_tests.sh --unit-only

test-python: setup all asan
	@scripts/run_tests.sh --python-only

test-gpu: all
	@scripts/test_gpu.sh

bench-gpu: all
	@scripts/bench_gpu.sh

clean:
	rm -rf build .pytest_cache

help:
	@echo "orchid make targets:"
	@echo "  make           build build/orchid (CUDA parts too when nvcc is present)"
	@echo "  make cpu       build without CUDA"
	@echo "  make run       set up, build, make the tiny default model, serve it on 127.0.0.1:8000"
	@echo "  make test      set up, build (normal + ASan/UBSan), run unit and Python parity tests"
	@echo "  make test-gpu  GPU tests (needs an NVIDIA GPU)"
	@echo "  make bench-gpu benchmark on a full-shape synthetic checkpoint (needs a GPU)"
	@echo "  make setup     install Debian -dev packages and the .venv tools (idempotent)"
	@echo "  make clean     remove build outputs"

-include $(LIB_OBJ:.o=.d) $(APP_OBJ:.o=.d) $(ASAN_LIB_OBJ:.o=.d) $(ASAN_APP_OBJ:.o=.d)

# --- fuzzing (issue 7): libFuzzer targets tests/fuzz/fuzz_*.c, clang + ASan + UBSan ---
FUZZ := build/fuzz
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS := $(CFLAGS_COMMON) -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ)/%)
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ)/%.o)

$(FUZZ)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ)/liborchid.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ)/liborchid.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ)/liborchid.a $(LIBS)

.PHONY: fuzz fuzz-smoke fuzz-build
fuzz-build: $(FUZZ_BIN)

fuzz: setup fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh $(FUZZ_BIN)

fuzz-smoke: setup fuzz-build
	@FUZZ_SECONDS=3 scripts/fuzz.sh $(FUZZ_BIN)

-include $(FUZZ_LIB_OBJ:.o=.d)

# --- GPU tests (cuda helper) ---
# tests/gpu/*.c: the CUDA backend against the CPU reference (test_cuda_ops: the ops;
# test_cuda_model: the backend as a whole; test_cuda_sample) and the benchmark harnesses. They link only what they use (no HTTP/text libs), so
# the binaries run on a GPU machine that has just the CUDA driver and libcjson.
ifeq ($(CUDA),1)
GPU_SRC := $(sort $(wildcard tests/gpu/*.c))
GPU_BIN := $(GPU_SRC:tests/gpu/%.c=$(BUILD)/tests/gpu/%)
GPU_LIBS := -lcjson -lm -lpthread $(CUDA_LIBS)

$(BUILD)/tests/gpu/%: tests/gpu/%.c tests/gpu/gpu_common.h tests/unit/check.h tests/unit/tmodel.h $(BUILD)/liborchid.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -Itests/gpu -o $@ $< $(BUILD)/liborchid.a $(GPU_LIBS)

.PHONY: gpu-tests
gpu-tests: $(GPU_BIN)
test-gpu: gpu-tests
bench-gpu: gpu-tests
endif
