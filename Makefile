# The two commands a new user types (README.md): `make demo` and `make test`.
# Both install what is missing (scripts/setup, by group), build, then train or test: the demo
# only the build's Debian packages and Fashion-MNIST (`scripts/setup demo`: nothing from PyPI),
# the tests the rest (`scripts/setup test`: oracles, servers, clang, moto's S3 server from PyPI).
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CRUCIBLE := $(BUILD_DIR)/crucible

FUZZ_DIR ?= build-fuzz
TSAN_DIR ?= build-tsan
# The second supported libtorch: current torch from PyPI in a project-local venv (DESIGN.md).
TORCH2_DIR ?= build-torch2
TORCH2_VENV ?= .venv-torch2
# Test labels make test-torch2 leaves out (CI also leaves out `heavy`: .ci/run).
TORCH2_EXCLUDE ?= slow

.PHONY: all setup setup-demo setup-bench setup-test setup-torch2 configure build demo demo-detection test test-sanitize test-tsan \
	test-torch2 bench bench-torch2 python test-python clean

all: build

setup: setup-test

setup-demo:
	@scripts/setup demo

setup-bench:
	@scripts/setup bench

setup-test:
	@scripts/setup test

# The Python module `crucible` (python/) builds with the rest, for the Python whose torch it serves.
# One configuration for the demo and the tests (make test reuses the demo's folder): its packages
# (GTest, pybind11, Python.h among them) are in the demo group.
$(BUILD_DIR)/build.ninja: CMakeLists.txt | setup-demo
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
	  -DCRUCIBLE_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null

configure: setup-demo $(BUILD_DIR)/build.ninja

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Trains the default job (configs/fashion_mnist.toml) into runs/fashion_mnist/ and checks its
# accuracy (time is reported, not judged). Builds the program alone, not the tests.
# --restart: a demo always trains from scratch (a previous demo run is replaced).
demo: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target crucible_cli
	@$(CRUCIBLE) train --restart
	@scripts/demo-verdict runs/fashion_mnist/summary.json

# The detection demo (configs/detection_demo.toml): FCOS over ResNet-18 trained from scratch on
# Fashion-MNIST articles pasted onto textured backgrounds (scripts/make-fashion-detection-set, from
# Debian's dataset-fashion-mnist), then its COCO AP against the stated target.
demo-detection: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target crucible_cli
	@scripts/make-fashion-detection-set data/fashion-detection
	@$(CRUCIBLE) train configs/detection_demo.toml --restart
	@scripts/demo-verdict runs/detection_demo/summary.json --metric test_AP --target 0.30

test: setup-test build test-sanitize test-tsan
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 1200; rc=$$?; \
	  cd $(CURDIR) && scripts/count-skips $(BUILD_DIR) --label 'make test'; exit $$rc

# The torch-free library and its tests under clang with ASan + UBSan, plus every parser's
# libFuzzer target: corpus replay and a short bounded fuzzing run each.
$(FUZZ_DIR)/build.ninja: CMakeLists.txt | setup-test
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCRUCIBLE_WITH_TORCH=OFF -DCRUCIBLE_FUZZ=ON "-DCRUCIBLE_SANITIZE=address;undefined" >/dev/null

test-sanitize: setup-test $(FUZZ_DIR)/build.ninja
	@cmake --build $(FUZZ_DIR) -j $(JOBS)
	@cd $(FUZZ_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600; rc=$$?; \
	  cd $(CURDIR) && scripts/count-skips $(FUZZ_DIR) --label 'make test-sanitize'; exit $$rc

# The loader and thread pool under ThreadSanitizer (torch-free build).
$(TSAN_DIR)/build.ninja: CMakeLists.txt | setup-test
	@CC=clang CXX=clang++ cmake -S . -B $(TSAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCRUCIBLE_WITH_TORCH=OFF -DCRUCIBLE_SANITIZE=thread >/dev/null

test-tsan: setup-test $(TSAN_DIR)/build.ninja
	@cmake --build $(TSAN_DIR) -j $(JOBS) --target base_tests
	@cd $(TSAN_DIR) && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) \
	  -R "Loader|ThreadPool|ImagePipeline"

# The test suite again, built against current torch from PyPI (scripts/setup --torch pypi: the
# test group, then pinned torch + torchvision in $(TORCH2_VENV)); CUDA paths compiled when nvcc
# is found. GPU tests skip without a GPU (scripts/device-check runs them on one). The torch-free
# base_tests are make test's alone (they link no torch).
setup-torch2:
	@scripts/setup --torch pypi

$(TORCH2_DIR)/build.ninja: CMakeLists.txt | setup-torch2
	@cmake -S . -B $(TORCH2_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCRUCIBLE_BASE_TESTS=OFF \
	  -DCRUCIBLE_TORCH_PYTHON=$(CURDIR)/$(TORCH2_VENV)/bin/python \
	  -DCRUCIBLE_PYTHON=ON -DPython3_EXECUTABLE=$(CURDIR)/$(TORCH2_VENV)/bin/python >/dev/null

test-torch2: setup-torch2 $(TORCH2_DIR)/build.ninja
	@cmake --build $(TORCH2_DIR) -j $(JOBS)
	@cd $(TORCH2_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 1200 -LE '$(TORCH2_EXCLUDE)'; rc=$$?; \
	  cd $(CURDIR) && scripts/count-skips $(TORCH2_DIR) --label 'make test-torch2'; exit $$rc

# The Python module `crucible` (python/): torch-free, built into $(BUILD_DIR)/python/crucible;
# import it with PYTHONPATH=$(BUILD_DIR)/python /usr/bin/python3. Its tests run in make test
# (and in make test-torch2 with that venv's Python and torch).
python: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target crucible_native
	@echo "python: PYTHONPATH=$(CURDIR)/$(BUILD_DIR)/python /usr/bin/python3 -c 'import crucible'"

test-python: setup-test build
	@cd $(BUILD_DIR) && ctest --output-on-failure -R '^Python\.'

bench: setup-bench build
	@bench/fmnist_vs_pytorch
	@bench/loader_vs_pytorch
	@bench/ddp_vs_pytorch
	@bench/archive_vs_numpy
	@bench/resnet_vs_pytorch

# Benchmarks with both libtorch versions: PyTorch 1.13 (Debian) and current PyTorch (eager and
# torch.compile) as baselines, crucible built against each.
bench-torch2: build setup-torch2 $(TORCH2_DIR)/build.ninja
	@cmake --build $(TORCH2_DIR) -j $(JOBS) --target crucible_cli
	@bench/fmnist_vs_pytorch --rounds 3 --torch2 $(TORCH2_VENV)/bin/python --crucible2 $(TORCH2_DIR)/crucible
	@bench/loader_vs_pytorch --rounds 3 --torch2 $(TORCH2_VENV)/bin/python
	@bench/ddp_vs_pytorch --rounds 3 --torch2 $(TORCH2_VENV)/bin/python --crucible2 $(TORCH2_DIR)/crucible

clean:
	rm -rf $(BUILD_DIR) $(FUZZ_DIR) $(TSAN_DIR) $(TORCH2_DIR)
