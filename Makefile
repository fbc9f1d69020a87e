# Convenience front door over CMake. `make run` and `make test` are the README's two set-up commands.
BUILD ?= build
JOBS ?= $(shell nproc)
PROMPT ?= Write a haiku about a kiln.
CMAKE_FLAGS ?=

.PHONY: all deps build run test asan cuda model fuzz clean

all: build

deps:
	@scripts/deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

model:
	@scripts/fetch-model.sh >/dev/null

run: build model
	$(BUILD)/kiln run -m $$(scripts/fetch-model.sh) --chat -p "$(PROMPT)" -n 128

test: build model
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer (no CUDA).
asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_CUDA=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) -L unit

fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_CUDA=OFF
	cmake --build build-fuzz -j $(JOBS)

clean:
	rm -rf $(BUILD) build-asan build-fuzz
