#!/usr/bin/env bash
# The one script for the GPU machine, run from binaries built here: that machine has CUDA, its
# driver and PyTorch, but none of Debian's packages dimsum builds with, so nothing is compiled
# there.
#
#   here:            ./scripts/gpu_check.sh --prepare    # builds the GPU tests into build-gpu/
#   on the GPU:      ./scripts/gpu_check.sh              # (carry build-gpu/), about 7 minutes
#
# In order, so that a run cut short still says the most important things: the machine (kernel,
# GPU, driver, the binaries' libraries, NVIDIA_TF32_OVERRIDE, which changes cuBLAS's choice
# behind a program's back), then the CUDA backend's parity tests against the reference backend
# with DIMSUM_REQUIRE_GPU=1, so that a machine without a usable GPU fails instead of skipping,
# and examples/gpu_attention, then large cases against PyTorch in float64 on the device, then
# dimsum_gpu_bench (src/gpu_bench.cpp) and PyTorch on the same cases (gpu_torch.py) with the
# side-by-side table, then compute-sanitizer's memcheck on the attention tests, then bf16 on
# the machine's own processor where it has AMX (see below). On 2026-12-04 the whole took
# about 7 minutes on an H200 machine whose Xeon has AMX (the AMX part about 3 of them).
#
# AMX: no machine of this project has exposed Intel's tile unit (docs/performance.md, "where
# the targets stand"), while a GPU machine's host is often a Xeon that has it. So the binaries
# carried include the bf16 kernels' hardware tests and dimsum_bench, built for x86-64-v4
# (AVX-512) and run only where the processor reports avx512bw and amx_tile: the tile kernels'
# first run, and the AMX peak beside the bf16 products and attention.
# Each part has its own time limit; the outputs are also written to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${DIMSUM_GPU_BIN:-build-gpu}

if [ "${1:-}" = "--prepare" ]; then
    # its own build folder, for x86-64-v3 (AVX2): the GPU machine's processor is not this one's
    set -e
    cmake -S . -B build-gpu-prepare -DCMAKE_BUILD_TYPE=Release -DDIMSUM_CUDA=ON -DDIMSUM_ARCH=x86-64-v3 >/dev/null
    cmake --build build-gpu-prepare -j2 --target test_cuda_gpu dimsum_gpu_bench gpu_attention
    mkdir -p "$bin"
    cp build-gpu-prepare/tests/test_cuda_gpu build-gpu-prepare/src/dimsum_gpu_bench build-gpu-prepare/examples/gpu_attention "$bin/"
    # the bf16 hardware tests and the bench, for a host with AVX-512 (and perhaps AMX), with the
    # C++ and OpenMP runtimes in the binaries as for the GPU programs: OpenMP's library is
    # named to FindOpenMP as the static archive (given as a linker flag instead, it hides the
    # library from FindOpenMP, which then links none)
    cmake -S . -B build-gpu-prepare-host -DCMAKE_BUILD_TYPE=Release -DDIMSUM_CUDA=OFF -DDIMSUM_ARCH=x86-64-v4 \
        "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc" "-DOpenMP_gomp_LIBRARY=$(g++ -print-file-name=libgomp.a)" \
        >/dev/null
    cmake --build build-gpu-prepare-host -j2 --target bf16_instructions_on_this_cpu dimsum_bench
    cp build-gpu-prepare-host/tests/bf16_instructions_on_this_cpu build-gpu-prepare-host/src/dimsum_bench "$bin/"
    for program in test_cuda_gpu bf16_instructions_on_this_cpu dimsum_bench; do
        ldd "$bin/$program"
        if ldd "$bin/$program" | grep -E -q 'libstdc\+\+|libgomp'; then
            echo "FAILED: $program links the C++ or OpenMP runtime dynamically"
            exit 1
        fi
    done
    du -sh "$bin"
    echo "ready: carry $bin/ to the GPU machine and run scripts/gpu_check.sh there"
    exit 0
fi

status=0
echo "== machine"
uname -r
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv || status=1
echo "NVIDIA_TF32_OVERRIDE=${NVIDIA_TF32_OVERRIDE-unset}"
ldd --version | head -n 1

# cuBLAS (libcublas.so.13, libcublasLt.so.13): the system's, else CUDA's own folders, else
# the one PyTorch's wheels bring (nvidia/*/lib or nvidia/cu13/lib in site-packages)
if ldd "$bin/test_cuda_gpu" | grep -q 'libcublas.*not found'; then
    found=$( (ls -d /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib 2>/dev/null
              python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null |
                  while read -r d; do find "$d/nvidia" -name 'libcublas.so.13*' -printf '%h\n' 2>/dev/null; done) |
             while read -r d; do [ -e "$d/libcublas.so.13" ] && echo "$d"; done | head -n 1)
    if [ -n "$found" ]; then
        echo "cuBLAS from $found"
        export LD_LIBRARY_PATH="$found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
fi
echo "== libraries of $bin/test_cuda_gpu"
ldd "$bin/test_cuda_gpu"
if ldd "$bin/test_cuda_gpu" | grep -q 'not found'; then
    echo "FAILED: a library the tests need is missing"
    exit 1
fi

# the results folder; with $OUT set (the device tool's folder, which brings back at most 8
# files), packed into $OUT/gpu_check.tar.gz at the end
out=/tmp/gpu_check
rm -rf "$out" && mkdir -p "$out"
echo "== the CUDA backend against the reference backend"
DIMSUM_REQUIRE_GPU=1 DIMSUM_CUDA_SYNC=1 timeout 90 "$bin/test_cuda_gpu" 2>&1 | tee "$out/tests.txt" | tail -n 40 || status=1
echo "== examples/gpu_attention: the README's attention on device tensors, against the CPU backend"
timeout 30 "$bin/gpu_attention" 2>&1 | tee "$out/gpu_attention.txt" | tail -n 3 || status=1  # 77: no device

echo "== against PyTorch in float64 on the device, at sizes too large for the reference backend"
rm -rf "$out/parity" && mkdir -p "$out/parity"
timeout 45 "$bin/dimsum_gpu_bench" --parity "$out/parity" 2>&1 | tail -n 1 || status=1
timeout 45 python3 scripts/gpu_torch.py --parity "$out/parity" 2>&1 | tee "$out/parity.txt" || status=1
rm -f "$out"/parity/*.npy  # hundreds of MB; parity.txt keeps the verdicts

echo "== dimsum_gpu_bench"
timeout 120 "$bin/dimsum_gpu_bench" 2>&1 | tee "$out/dimsum_gpu_bench.txt" || status=1
echo "== PyTorch on the same cases, then the two side by side (also $out/gpu_bench.csv)"
timeout 90 python3 scripts/gpu_torch.py --dimsum "$out/dimsum_gpu_bench.txt" --csv "$out/gpu_bench.csv" 2>&1 |
    tee "$out/gpu_torch.txt" || echo "(PyTorch's run failed or was cut)"

# compute-sanitizer's memcheck on the smallest kernels' tests, where it can reach the device:
# on Firecracker (kernel "...-fc-..."), not on gVisor, where it refuses the device
if [[ "$(uname -r)" == *-fc-* ]] && command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer memcheck: attention (tiled, row, split) and decoding"
    # one test spec, its patterns separated by commas (Catch2 v2); -w NoTests: none matched fails
    DIMSUM_REQUIRE_GPU=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/test_cuda_gpu" -w NoTests \
        "cuda: attention as the paper*,cuda: decoding*" 2>&1 | tee "$out/memcheck.txt" | tail -n 6 || status=1
else
    echo "== compute-sanitizer: not run (gVisor, or not installed)"
fi

echo "== bf16 on this machine's processor: AMX where it has it"
grep -m 1 'model name' /proc/cpuinfo
flags=$(grep -m 1 '^flags' /proc/cpuinfo)
for flag in avx512bw avx512_bf16 amx_tile amx_bf16; do
    printf '%s: %s\n' "$flag" "$(grep -q -w "$flag" <<<"$flags" && echo yes || echo no)"
done
if grep -q -w avx512bw <<<"$flags" && grep -q -w amx_tile <<<"$flags"; then
    # the bench's PyTorch yardsticks with the machine's own python3 (not Debian's /usr/bin/python3)
    DIMSUM_PYTHON=$(command -v python3 || true)
    export DIMSUM_PYTHON
    # the kernels on their instructions against the reference backend; it names the paths it ran
    # (77: no path could run, e.g. Linux refused the tiles: a skip, with its reasons)
    timeout 90 "$bin/bf16_instructions_on_this_cpu" >"$out/bf16_instructions.txt" 2>&1
    tests_status=$?
    head -n 2 "$out/bf16_instructions.txt"  # which paths ran
    tail -n 8 "$out/bf16_instructions.txt"
    [ $tests_status = 0 ] || [ $tests_status = 77 ] || status=1
    # the AMX peak (a tile loop), the products on each path, BERT's attention layer on the best;
    # the yardsticks of this machine (OpenBLAS, oneDNN, PyTorch) are skipped where absent
    timeout 75 "$bin/dimsum_bench" --filter=bf16_gemm_1024 --threads=1 --csv="$out/bf16_gemm.csv" 2>&1 |
        tee "$out/bf16_gemm.txt" | grep -E 'peak|amx|skipped' || echo "(the bf16 products' run failed or was cut)"
    timeout 75 "$bin/dimsum_bench" --filter=bf16_attention_8x128 --threads=1 --csv="$out/bf16_attention.csv" 2>&1 |
        tee "$out/bf16_attention.txt" | grep -E 'peak|bf16_attention|skipped' || echo "(the bf16 attention's run failed or was cut)"
else
    echo "no AVX-512 with AMX here: the bf16 checks are skipped"
fi

echo "== gpu_check: $([ $status = 0 ] && echo passed || echo FAILED)"
[ -n "${OUT:-}" ] && tar czf "$OUT/gpu_check.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
exit $status
