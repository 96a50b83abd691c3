#!/usr/bin/env bash
# The tests again under the sanitizers; any report fails the run:
# 1. the unit and parity tests and the examples under AddressSanitizer and UBSan (g++);
# 2. the tests that run teams of threads under ThreadSanitizer (clang; dimsum's own team is
#    std::thread and atomics, which TSan sees; libomp's Archer tool tells it about OpenMP's
#    barriers, for the tests that evaluate inside an OpenMP region of their own);
# 3. load_npy, and ds::load of .npz and .safetensors files, fuzzed side by side for
#    DIMSUM_FUZZ_SECONDS (60) with libFuzzer, ASan and UBSan, seeded with the reference files,
#    with a memory limit that makes a file whose claims cost far more than it holds a finding;
#    a finding stops the run and is left in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

# 1. AddressSanitizer and UBSan
# (dimsum::cuda, compiled by nvcc, is not sanitised: the CUDA tests run against the host stand-in here)
# -g1: line tables, all that a report's stack needs (full debug information took a tenth more
# time to compile: test_elementwise.cpp 32 s against 28 s)
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DDIMSUM_SANITIZE=address \
    -DDIMSUM_CUDA=OFF >/dev/null
cmake --build build-sanitize -j2
# The compile-fail, consumer and docs checks build nothing sanitised: the main run has them.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-sanitize --output-on-failure -j2 -E '^(compile_fail|consumer|docs)\.'

# 2. ThreadSanitizer
threaded_tests=(test_threads test_parity_gemm test_parity_kernels test_parity_attention test_bf16 test_bf16_gemm test_bf16_attention)
# -O1: half the compile time of -O2 here (test_bf16: 77 s against 155 s), and fast enough to
# run; -g1 as above
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_CXX_COMPILER=clang++ -DDIMSUM_SANITIZE=thread -DDIMSUM_CUDA=OFF >/dev/null
# one make for all of them, two at a time (cmake --build --target builds the targets one after
# another, each alone on the two cores)
cmake --build build-tsan -- -j2 "${threaded_tests[@]}"
archer=$(clang++ -print-resource-dir)/../../libarcher.so
[ -f "$archer" ] || archer=/usr/lib/llvm-14/lib/libarcher.so
pattern=$(IFS='|'; echo "^(${threaded_tests[*]}):")
OMP_TOOL_LIBRARIES="$archer" TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j2 -R "$pattern"

# 3. Fuzzing the file readers
fuzz() {  # fuzz NAME SEED_FILES...
    local name=$1
    shift
    rm -rf "build-fuzz/$name/seeds"
    mkdir -p "build-fuzz/$name/corpus" "build-fuzz/$name/seeds"
    local seed
    for seed in "$@"; do  # each under its path, so that files of one name in two folders both seed
        cp "$seed" "build-fuzz/$name/seeds/$(echo "$seed" | tr / _)"
    done
    clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude \
        "tests/fuzz/$name.cpp" -o "build-fuzz/$name/$name"
    # Memory: an input of 8 KiB may claim a deflated member of 8.5 MB (deflate's 1032-fold) or
    # a .npy header of 1 MiB, and loads nothing larger than its own bytes (the parameters
    # target's extents are static): one allocation of 2 MiB, or a process past 256 MB, is a
    # finding (issue 46: a 1 MB .npz that inflated to 1 GiB). ASan's quarantine of freed
    # memory, 256 MB by default, would pass that limit alone: 32 MB of it.
    ASAN_OPTIONS=quarantine_size_mb=32 "build-fuzz/$name/$name" -max_total_time="${DIMSUM_FUZZ_SECONDS:-60}" \
        -max_len=8192 -timeout=10 -rss_limit_mb=256 -malloc_limit_mb=2 \
        -artifact_prefix="build-fuzz/$name/" -print_final_stats=1 "build-fuzz/$name/corpus" "build-fuzz/$name/seeds" 2>&1 |
        tail -n 12
}
# The two side by side, one a core (a fuzzer is one process of one thread), each printing
# when both are done; either one's finding fails the run.
mkdir -p build-fuzz
fuzz fuzz_load_npy $(find tests/reference -name '*.npy' -size -64k) >build-fuzz/fuzz_load_npy.log 2>&1 &
npy=$!
fuzz fuzz_load_parameters tests/reference/parameters/*.npz tests/reference/parameters/*.safetensors \
    >build-fuzz/fuzz_load_parameters.log 2>&1 &
parameters=$!
npy_status=0 parameters_status=0
wait "$npy" || npy_status=$?
wait "$parameters" || parameters_status=$?
cat build-fuzz/fuzz_load_npy.log build-fuzz/fuzz_load_parameters.log
[ "$npy_status" -eq 0 ] && [ "$parameters_status" -eq 0 ]
