#!/bin/bash
# Runs the CUDA tests and benchmarks on a GPU machine from binaries built elsewhere and copied into .devrun/
# (bin/: test and bench executables, lib/: shared libraries the GPU machine lacks, py/: the gguf package; the three
# may come packed as pkg.tar.xz; models/: test models, smollm2.gguf.vocab: the default model's tokenizer alone, a GGUF named so that the model test does not take it).
# tests/cuda/pack_for_device.sh makes that folder from a CUDA build.
# Usage: tests/cuda/run_on_device.sh OUT_DIR [kernels] [memcheck] [racecheck] [memcheck-model] [initcheck-model] [gemv]
#        [attention] [launch] [ncu] [batch-ncu]
#        [model] [synth] [kiln] [debug] [default] [decode MODEL...] [batch] [memcheck-batch] [batch-bench MODEL...]
#        [batch-profile MODEL...] [price MODEL...] [carveout MODEL...] [kiln-bench MODEL...]
# (synth writes /tmp/qwen2-1.5b.gguf and /tmp/llama3-8b.gguf; default needs the default model's first part already
# at /root/kiln-m/a from an earlier call on the same machine and its rest in .devrun/models/default.b: too big for
# one call's carry)
set -u
out=$1; shift
root=$(cd "$(dirname "$0")/../.." && pwd)
devrun=${DEVRUN:-$root/.devrun} # another folder of the same shape when DEVRUN names one
[ -e "$devrun/pkg.tar.xz" ] && tar -xJf "$devrun/pkg.tar.xz" -C "$devrun"
export LD_LIBRARY_PATH=$devrun/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for d in $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, n, "lib") for p in nvidia.__path__ for n in os.listdir(p)))' 2>/dev/null); do
    LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
bin=$devrun/bin
status=0
run() { echo "== $*"; "$@" 2>&1 | tee -a "$out/log.txt"; local rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || { echo "!! exit $rc: $*"; status=1; }; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$out/gpu.txt"
while [ $# -gt 0 ]; do
    case $1 in
    kernels) run "$bin/cuda_kernels" ;;
    memcheck) run compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/cuda_kernels" ;;
    racecheck) run compute-sanitizer --tool racecheck --error-exitcode 3 "$bin/cuda_kernels" ;;
    initcheck-model) # reads of device memory never written, on one test model (the first reports kept)
        KILN_CUDA_TEST_MODELS="$devrun/models/tiny-qwen2-q4km.gguf" compute-sanitizer --tool initcheck \
            --print-limit 20 "$bin/cuda_model" > "$out/initcheck.txt" 2>&1
        grep -E "ERROR SUMMARY|Uninitialized|at 0x|by thread" "$out/initcheck.txt" | head -40 ;;
    memcheck-model) export KILN_CUDA_TEST_MODELS="$devrun/models/tiny-qwen2-q4km.gguf"
        run compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/cuda_model" ;;
    attention) run "$bin/bench_cuda_attention" ;;
    launch) run "$bin/bench_cuda_launch" 256 ;;
    gemv) run "$bin/bench_cuda_gemv" 4096 14336; run "$bin/bench_cuda_gemv" 14336 4096; run "$bin/bench_cuda_gemv" 1536 8960 ;;
    ncu) # hardware counters of a Q4_K GEMV from the bench (the Q4_K one: 8 quantized runs of 68 calls come first)
        ncu --kernel-name regex:gemv_q_kernel --launch-skip 550 --launch-count 1 --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
            "$bin/bench_cuda_gemv" > "$out/ncu.txt" 2>&1
        grep -E "gemv_q_kernel|Throughput|Duration|Warp Cycles|Stall|Occupancy|Registers|L1/TEX Hit|Mem Busy|Max Bandwidth|Issued" "$out/ncu.txt" | head -60 ;;
    batch-ncu) # the batched step's Q4_K gate/up mma GEMV at 64 vectors (a decode step's launch, eager): stall
        # reasons a issued instruction, warp instructions by pipe, registers (needs the synth stage's llama3-8b file)
        m="regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:smsp__inst_executed_pipe_[a-z]*\.sum$"
        KILN_CUDA_BATCH_GRAPH=0 ncu --kernel-name-base demangled --kernel-name regex:"gemv_batch_mma_kernel<q4_K_t, .bool.1" \
            --launch-skip 100 --launch-count 1 --metrics "$m,smsp__inst_executed.sum,gpu__time_duration.sum,launch__registers_per_thread" \
            "$bin/bench_cuda_batch" /tmp/llama3-8b.gguf 16 4 64 > "$out/batch-ncu.txt" 2>&1
        grep -E "gemv_batch_mma|stalled|inst_executed|duration|registers" "$out/batch-ncu.txt" | grep -vE " 0(\.00)?$" ;;
    model) export KILN_CUDA_TEST_MODELS="$(ls "$devrun"/models/*.gguf | tr '\n' ' ')"; run "$bin/cuda_model" ;;
    synth) # random Q4_K_M files at the reference shapes, made here (the generator's gguf package travels in .devrun/py)
        for shape in qwen2-1.5b llama3-8b; do
            [ -e /tmp/$shape.gguf ] || PYTHONPATH=$devrun/py run python3 "$root/tests/cuda/make_model.py" $shape q4_k_m /tmp/$shape.gguf
        done ;;
    kiln) # the CLI end to end: kiln synth files, kiln bench on the GPU with its profile, greedy text on GPU and CPU
        vocab=$devrun/models/smollm2.gguf.vocab
        for shape in smollm2-135m qwen2-1.5b; do
            [ -e /tmp/kiln-$shape.gguf ] || run "$bin/kiln" synth --shape $shape --type q4_k_m --vocab-from "$vocab" -o /tmp/kiln-$shape.gguf --quiet
            run "$bin/kiln" bench -m /tmp/kiln-$shape.gguf --device cuda --profile
        done
        for dev in cuda cpu; do
            "$bin/kiln" run -m /tmp/kiln-smollm2-135m.gguf --device $dev --temp 0 -n 48 -p "The quick brown fox" > "$out/greedy-$dev.txt" 2>>"$out/log.txt"
        done
        # a note, not a failure: on random weights the two paths' different activation rounding flips near-ties
        if cmp -s "$out/greedy-cuda.txt" "$out/greedy-cpu.txt"; then echo "greedy text: cuda == cpu"; else echo "note: greedy text differs (see greedy-*.txt)"; fi
        # the default sampler draws on the device: a seed gives the same text twice
        for i in 1 2; do
            "$bin/kiln" run -m /tmp/kiln-smollm2-135m.gguf --device cuda --seed 7 -n 48 -p "The quick brown fox" > "$out/sampled-$i.txt" 2>>"$out/log.txt"
        done
        if cmp -s "$out/sampled-1.txt" "$out/sampled-2.txt"; then echo "sampled text (seed 7): the same twice"; else echo "!! sampled text differs between two runs with seed 7"; status=1; fi ;;
    debug) # KILN_GPU_DEBUG=1: every op of each decode step against the CPU (on the kiln stage's synth model)
        [ -e /tmp/kiln-smollm2-135m.gguf ] && KILN_GPU_DEBUG=1 run "$bin/kiln" run -m /tmp/kiln-smollm2-135m.gguf --device cuda --temp 0 -n 3 -p "The quick brown fox" ;;
    default) # greedy text of the default model (trained weights) on the GPU against the CPU fast and reference paths
        if [ -e /root/kiln-m/a ] && [ -e "$devrun/models/default.b" ]; then
            cat /root/kiln-m/a "$devrun/models/default.b" > /tmp/default.gguf
            sha256sum /tmp/default.gguf
            for prompt in "The capital of France is" "Write a haiku about the sea." "def fibonacci(n):"; do
                for dev in cuda cpu; do "$bin/kiln" run -m /tmp/default.gguf --device $dev --temp 0 -n 64 -p "$prompt" > "$out/default-$dev.txt" 2>>"$out/log.txt"; done
                "$bin/kiln" run -m /tmp/default.gguf --reference --temp 0 -n 64 -p "$prompt" > "$out/default-ref.txt" 2>>"$out/log.txt"
                for other in cpu ref; do
                    if cmp -s "$out/default-cuda.txt" "$out/default-$other.txt"; then echo "default model, '$prompt': cuda == $other (64 tokens)"
                    else echo "default model, '$prompt': cuda != $other"; cat "$out/default-cuda.txt"; echo; echo ---; cat "$out/default-$other.txt"; echo; fi
                done
            done
            KILN_GPU_DEBUG=1 run "$bin/kiln" run -m /tmp/default.gguf --device cuda --temp 0 -n 4 -p "The capital of France is"
        else echo "default: the model's first part is not on this machine (a fresh one): skipped"; fi ;;
    decode) # KILN_BENCH_VARIANTS: the settings to compare against the default (bench_cuda_decode's own list if unset)
        shift; while [ $# -gt 0 ] && [ -e "$1" ]; do run "$bin/bench_cuda_decode" "$1" 512 128 ${KILN_BENCH_VARIANTS:-}; shift; done; continue ;;
    batch) # the batched multi-sequence step: its kernels, the forward on the test models, the scheduler on a synth model
        [ -e /tmp/kiln-smollm2-135m.gguf ] || run "$bin/kiln" synth --shape smollm2-135m --type q4_k_m \
            --vocab-from "$devrun/models/smollm2.gguf.vocab" -o /tmp/kiln-smollm2-135m.gguf --quiet
        run "$bin/cuda_batch_kernels"
        KILN_CUDA_TEST_MODELS="$(ls "$devrun"/models/*.gguf | tr '\n' ' ')" \
            KILN_CUDA_SCHED_MODEL=/tmp/kiln-smollm2-135m.gguf run "$bin/cuda_batch" ;;
    memcheck-batch) # needs the batch stage's synth model
        run compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/cuda_batch_kernels"
        KILN_CUDA_TEST_MODELS="$devrun/models/tiny-qwen2-q4km.gguf" KILN_CUDA_SCHED_MODEL=/tmp/kiln-smollm2-135m.gguf \
            run compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/cuda_batch" ;;
    price) # each small kernel and GEMV of a decode step priced inside the replayed graph: tg with it left out
        shift; while [ $# -gt 0 ] && [ -e "$1" ]; do
            run "$bin/bench_cuda_decode" "$1" 16 128 KILN_CUDA_SKIP=norm KILN_CUDA_SKIP=rope \
                KILN_CUDA_SKIP=attention KILN_CUDA_SKIP=quantize KILN_CUDA_SKIP=norm+rope+attention+quantize \
                KILN_CUDA_SKIP=qkv KILN_CUDA_SKIP=wo KILN_CUDA_SKIP=gate_up KILN_CUDA_SKIP=down KILN_CUDA_SKIP=head; shift
        done; continue ;;
    carveout) # KILN_CUDA_CARVEOUT=0 and =auto (opt-in) against the driver's choice where a small L1 split may
        # hold fewer blocks an SM: decode at 512 and 4000 positions (32 attention slices a head) and those prompts,
        # sampled decode (the top-k's sorts; a process each, against the default's headline), the batched step at
        # 1 and 64 sequences
        shift; while [ $# -gt 0 ] && [ -e "$1" ]; do
            run "$bin/bench_cuda_decode" "$1" 512 128 KILN_CUDA_GEMV_ADD_EARLY=1 KILN_CUDA_CARVEOUT=0 \
                KILN_CUDA_CARVEOUT=auto
            run "$bin/bench_cuda_decode" "$1" 4000 128 KILN_CUDA_GEMV_ADD_EARLY=1 KILN_CUDA_CARVEOUT=0 \
                KILN_CUDA_CARVEOUT=auto KILN_CUDA_CARVEOUT=0 KILN_CUDA_CARVEOUT=auto
            for c in -1 0 auto; do
                KILN_CUDA_CARVEOUT=$c run "$bin/bench_cuda_decode" "$1" 512 128
                KILN_CUDA_CARVEOUT=$c run "$bin/bench_cuda_batch" "$1" 128 64 1 64
            done; shift
        done; continue ;;
    kiln-bench) # kiln bench on the GPU over files as they are (the synth stage's have no tokenizer)
        shift; while [ $# -gt 0 ] && [ -e "$1" ]; do
            run "$bin/kiln" bench -m "$1" --device cuda -p 512 -n 128 -r 2; shift
        done; continue ;;
    batch-bench) shift; while [ $# -gt 0 ] && [ -e "$1" ]; do run "$bin/bench_cuda_batch" "$1"; shift; done; continue ;;
    batch-profile) # the batched step's per-op times (eager) at one and two sequences
        shift; while [ $# -gt 0 ] && [ -e "$1" ]; do KILN_BATCH_PROFILE=1 run "$bin/bench_cuda_batch" "$1" 128 64 1 2; shift; done; continue ;;
    *) echo "unknown stage $1"; status=1 ;;
    esac
    shift
done
exit $status
