#!/usr/bin/env bash
# The one script for the GPU machine, run from binaries built here: that machine has CUDA, its
# driver and PyTorch, but none of Debian's packages dimsum builds with, so nothing is compiled
# there.
#
#   here:            ./scripts/gpu_check.sh --prepare    # builds the GPU tests into build-gpu/
#   on the GPU:      ./scripts/gpu_check.sh              # (carry build-gpu/), at most 7 minutes
#
# In order, so that a run cut short still says the most important things: the machine (kernel,
# GPU, driver, the binaries' libraries, NVIDIA_TF32_OVERRIDE, which changes cuBLAS's choice
# behind a program's back), then the CUDA backend's parity tests against the reference backend
# with DIMSUM_REQUIRE_GPU=1, so that a machine without a usable GPU fails instead of skipping,
# and examples/gpu_attention, then large cases against PyTorch in float64 on the device, then
# dimsum_gpu_bench (src/gpu_bench.cpp) and PyTorch on the same cases (gpu_torch.py), with the
# side-by-side table printed last.
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
    ldd "$bin/test_cuda_gpu"
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

out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
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

echo "== gpu_check: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
