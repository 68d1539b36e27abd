# The two commands a new user types (README.md): `make demo` and `make test`.
# Both install what is missing (scripts/setup), build, then train or test.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CRUCIBLE := $(BUILD_DIR)/crucible

.PHONY: all setup configure build demo test bench clean

all: build

setup:
	@scripts/setup

$(BUILD_DIR)/build.ninja: CMakeLists.txt | setup
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null

configure: setup $(BUILD_DIR)/build.ninja

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Trains the default job (configs/fashion_mnist.toml) into runs/fashion_mnist/.
# --restart: a demo always trains from scratch (a previous demo run is replaced).
demo: build
	@$(CRUCIBLE) train --restart

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 1200

bench: build
	@bench/fmnist_vs_pytorch

clean:
	rm -rf $(BUILD_DIR)
