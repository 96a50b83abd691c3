#!/usr/bin/env bash
# Installs the Debian 12 packages dimsum needs to build and test, when they are missing.
# Safe to run again: it installs nothing that is already there.
set -euo pipefail

packages=(
    g++ cmake make              # the build
    xtensor-dev xtl-dev         # xtensor: the tests' independent check; xtl: needed by xsimd's CMake target
    libxsimd-dev                # SIMD kernels
    libboost-dev                # Boost.Hana (headers)
    libomp-dev                  # OpenMP (g++ brings its own libgomp; clang needs this)
    clang libclang-rt-14-dev    # scripts/sanitize.sh: ThreadSanitizer with libomp, libFuzzer
    catch2                      # Catch2 v2, the unit tests
    python3                     # the docs check
    libopenblas-dev libdnnl-dev # the baselines of dimsum_bench (src/bench/), loaded at run time; the library uses neither
    libopenmpi-dev openmpi-bin  # dimsum::dist (tensor parallelism over MPI) and its tests under mpirun
)
# Optional (DIMSUM_WITH_TORCH=1): only tests/reference/generate*.py need them, to remake the
# committed reference data.
optional=(python3-torch python3-numpy)
# Optional (DIMSUM_WITH_BENCH=1), asked for by scripts/bench.sh: scripts/plot_performance.py
# draws the charts of docs/performance.md with matplotlib; the attention cases run PyTorch
# (scripts/attention_torch.py) beside dimsum, and are compared with the FMA peak only without it.
optional_bench=(python3-matplotlib python3-torch python3-numpy)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
wanted=()
if [ "${DIMSUM_WITH_TORCH:-0}" = 1 ]; then wanted+=("${optional[@]}"); fi
if [ "${DIMSUM_WITH_BENCH:-0}" = 1 ]; then wanted+=("${optional_bench[@]}"); fi
for p in ${wanted[@]+"${wanted[@]}"}; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

echo "dimsum setup: installing ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "dimsum setup: these Debian packages are missing: ${missing[*]}" >&2
    echo "dimsum setup: run this script as root (or install sudo), or install them yourself with apt-get." >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
