#!/bin/bash
# Fills .devrun/ for tests/cuda/run_on_device.sh from a CUDA build made here: the GPU tests, benchmarks and kiln
# (bin/), the shared libraries they load that a bare CUDA image lacks (lib/), the gguf package for make_model.py
# (py/), packed into pkg.tar.xz so the carry stays small, and the test models (models/: random-weight GGUFs of
# every type mix cuda_model checks, and a vocab-only GGUF as smollm2.gguf.vocab for kiln synth).
# Usage: tests/cuda/pack_for_device.sh [BUILD_DIR]   (default build/; then carry .devrun in the device call)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
devrun=$root/.devrun
grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=.*nvcc' "$build/CMakeCache.txt" 2>/dev/null ||
    { echo "pack_for_device: $build is not a CUDA build (make build with nvcc on the PATH)" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" >/dev/null

rm -rf "$devrun"
mkdir -p "$devrun/bin" "$devrun/lib" "$devrun/py" "$devrun/models"
bins=(tests/cuda/cuda_kernels tests/cuda/cuda_model tests/cuda/cuda_batch_kernels tests/cuda/cuda_batch
      bench/bench_cuda_decode bench/bench_cuda_gemv bench/bench_cuda_attention bench/bench_cuda_launch
      bench/bench_cuda_batch kiln)
for b in "${bins[@]}"; do cp "$build/$b" "$devrun/bin/"; done

# every library the binaries load except the C runtime and CUDA's own (the device image has both)
ldd "$devrun"/bin/* | awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' |
    grep -vE '/(libcuda|libcudart|libcublas[^/]*|libnccl)\.so' |
    xargs -r cp -L -t "$devrun/lib/"

gguf_dir=$(python3 -c 'import gguf, os; print(os.path.dirname(gguf.__file__))')
cp -r "$gguf_dir" "$devrun/py/"
# every binary holds the same kernels (~30 MB): a dictionary spanning several binaries stores them about once
tar -cf - -C "$devrun" bin lib py | xz -T1 -6 --lzma2=preset=6,dict=256MiB > "$devrun/pkg.tar.xz"
rm -rf "$devrun/bin" "$devrun/lib" "$devrun/py"

make_model() { python3 "$root/tests/cuda/make_model.py" "$1" "$2" "$devrun/models/$3.gguf"; }
make_model tiny-llama q4_k_m tiny-llama-q4km
make_model tiny-llama all tiny-llama-all
make_model tiny-llama float tiny-llama-float
make_model tiny-qwen2 q4_k_m tiny-qwen2-q4km
cp "$root/../shared/vocab/ggml-vocab-llama-spm.gguf" "$devrun/models/smollm2.gguf.vocab"
du -sh "$devrun"
