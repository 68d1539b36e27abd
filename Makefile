# The two commands a new user types (README.md): `make demo` and `make test`.
# Both install what is missing (scripts/setup), build, then train or test.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CRUCIBLE := $(BUILD_DIR)/crucible

FUZZ_DIR ?= build-fuzz
TSAN_DIR ?= build-tsan

.PHONY: all setup configure build demo test test-sanitize test-tsan bench clean

all: build

setup:
	@scripts/setup

$(BUILD_DIR)/build.ninja: CMakeLists.txt | setup
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null

configure: setup $(BUILD_DIR)/build.ninja

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Trains the default job (configs/fashion_mnist.toml) into runs/fashion_mnist/ and checks its
# accuracy (time is reported, not judged). Builds the program alone, not the tests.
# --restart: a demo always trains from scratch (a previous demo run is replaced).
demo: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target crucible_cli
	@$(CRUCIBLE) train --restart
	@scripts/demo-verdict runs/fashion_mnist/summary.json

test: build test-sanitize test-tsan
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 1200

# The torch-free library and its tests under clang with ASan + UBSan, plus every parser's
# libFuzzer target: corpus replay and a short bounded fuzzing run each.
$(FUZZ_DIR)/build.ninja: CMakeLists.txt | setup
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCRUCIBLE_WITH_TORCH=OFF -DCRUCIBLE_FUZZ=ON "-DCRUCIBLE_SANITIZE=address;undefined" >/dev/null

test-sanitize: setup $(FUZZ_DIR)/build.ninja
	@cmake --build $(FUZZ_DIR) -j $(JOBS)
	@cd $(FUZZ_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

# The loader and thread pool under ThreadSanitizer (torch-free build).
$(TSAN_DIR)/build.ninja: CMakeLists.txt | setup
	@CC=clang CXX=clang++ cmake -S . -B $(TSAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCRUCIBLE_WITH_TORCH=OFF -DCRUCIBLE_SANITIZE=thread >/dev/null

test-tsan: setup $(TSAN_DIR)/build.ninja
	@cmake --build $(TSAN_DIR) -j $(JOBS) --target base_tests
	@cd $(TSAN_DIR) && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) \
	  -R "Loader|ThreadPool|ImagePipeline"

bench: build
	@bench/fmnist_vs_pytorch
	@bench/loader_vs_pytorch
	@bench/ddp_vs_pytorch
	@bench/archive_vs_numpy

clean:
	rm -rf $(BUILD_DIR) $(FUZZ_DIR) $(TSAN_DIR)
